"""A compute party that deviates in one message (tests only): on this directory's path (its
daemon's PYTHONPATH, so in the daemon and every job worker it starts), the party's transport
alters one outgoing message chosen by ``MPC_ERM_TEST_DEVIATE``:

* ``reveal-flip:K`` — one bit of its share in the K-th aggregate's reveal (K from 0), in the
  message to rank 0 only: the parties end up with different "public" values;
* ``setup-zero`` — its first point-to-point message (CrypTen's pairwise seed to the next party)
  zeroed: the pairwise random stream is no longer shared;
* ``serve-altered:R`` — the release of round R its owner intake serves to its owners, one bit
  flipped (the value the parties agreed on, and signed, stays as it was);
* ``drop-owner:R`` — in round R its owner intake acknowledges the share of its first owner (the
  lowest index among those whose explicit party it is) and then claims it never arrived: the
  owner is left out of the round, as the network could have done;
* ``drop:K`` — its K-th tensor message (K from 0) posted after the MPC session is set up (the
  parties' set-up check passed) never sent, while the caller is told it was delivered: the
  message's key is used up, as when it is lost on the way, so the receiver waits for it in vain;
* ``verified-flip:K`` — in the malicious-secure aggregate, one bit of its K-th all-gather (K from
  0, counted over the job's aggregates) flipped in what every recipient gets alike;
* ``verified-input:R`` — in the R-th malicious-secure aggregate (R from 0), its contribution
  scaled to 100 times its bound and proved by a forger (tests/mpc/forgery.py);
* ``verdict-split:R`` — at the unanimous end of the R-th malicious-secure release (R from 0), its
  signed verdict to rank 0 names another value than its verdict to rank 2 (equivocation: the
  selective abort the digest agreement alone allowed).

The patches are applied when the modules are loaded; the party otherwise follows the protocol."""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future

import torch

from tests.parties.patch_on_import import patch_on_import

SCHEDULE = os.environ.get("MPC_ERM_TEST_DEVIATE", "")
_state = {"aggregate": -1, "in_reveal": False, "p2p": 0, "done": False, "set_up": False, "posted": 0,
          "verified": -1, "gathers": 0, "verdicts": -1}
_lock = threading.Lock()  # the count of posted messages: one number, whichever thread posts


def _patch_endpoint(module):  # type: ignore[no-untyped-def]
    post = module.Endpoint.post

    def deviating(self, dst, op, payload, **kw):  # type: ignore[no-untyped-def]
        if not _state["done"] and isinstance(payload, torch.Tensor):
            kind, _, arg = SCHEDULE.partition(":")
            if kind == "reveal-flip" and _state["in_reveal"] and _state["aggregate"] == int(arg) \
                    and op.startswith("all_reduce") and dst == 0:
                payload = payload.clone()
                payload.view(-1)[:1].bitwise_xor_(1 << 40)
                _state["done"] = True
            elif kind == "setup-zero" and op == "p2p":
                payload = torch.zeros_like(payload)
                _state["done"] = True
            elif kind == "drop" and _state["set_up"]:
                with _lock:
                    n = _state["posted"]
                    _state["posted"] += 1
                if n == int(arg):
                    self._take_seq(self._send_seq, dst)  # the key the lost message would have had
                    _state["done"] = True
                    sent: Future[None] = Future()
                    sent.set_result(None)
                    return sent
        return post(self, dst, op, payload, **kw)

    module.Endpoint.post = deviating


class _RevealComm:
    """The aggregator's communicator, marking its all_reduce (the reveal) for the transport patch."""

    def __init__(self, comm):  # type: ignore[no-untyped-def]
        self._comm = comm

    def __getattr__(self, name):  # type: ignore[no-untyped-def]
        return getattr(self._comm, name)

    def all_reduce(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        _state["in_reveal"] = True
        try:
            return self._comm.all_reduce(*args, **kwargs)
        finally:
            _state["in_reveal"] = False


def _patch_agreement(module):  # type: ignore[no-untyped-def]
    check = module.check_setup

    def checked(*args, **kwargs):  # type: ignore[no-untyped-def]
        check(*args, **kwargs)
        _state["set_up"] = True  # the session is set up: from here on ``drop:K`` counts

    module.check_setup = checked


def _patch_aggregator(module):  # type: ignore[no-untyped-def]
    reveal = module.MpcAggregator._noise_and_reveal

    def tracked(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        _state["aggregate"] += 1
        comm, self.comm = self.comm, _RevealComm(self.comm)
        try:
            return reveal(self, *args, **kwargs)
        finally:
            self.comm = comm

    module.MpcAggregator._noise_and_reveal = tracked


class _FlipGather:
    """The verified aggregator's communicator: ``verified-flip:K`` alters its K-th all-gather."""

    def __init__(self, comm):  # type: ignore[no-untyped-def]
        self._comm = comm

    def __getattr__(self, name):  # type: ignore[no-untyped-def]
        return getattr(self._comm, name)

    def all_gather(self, tensor):  # type: ignore[no-untyped-def]
        _, _, arg = SCHEDULE.partition(":")
        n = _state["gathers"]
        _state["gathers"] += 1
        if n == int(arg) and not _state["done"]:
            tensor = tensor.clone()
            tensor.reshape(-1).view(torch.uint8)[-1] ^= 1
            _state["done"] = True
        return self._comm.all_gather(tensor)


def _patch_verified(module):  # type: ignore[no-untyped-def]
    aggregate = module.VerifiedAggregator.aggregate

    def deviating(self, contributions, weights, noise):  # type: ignore[no-untyped-def]
        _state["verified"] += 1
        kind, _, arg = SCHEDULE.partition(":")
        if kind == "verified-input" and _state["verified"] == int(arg):
            from tests.mpc.forgery import forge

            local = weights.double() @ contributions.double()
            contributions = contributions * (100.0 * max(self.bounds) / max(float(local.norm()), 1e-12))
            honest, module.N.prove_norm = module.N.prove_norm, forge
            try:
                return aggregate(self, contributions, weights, noise)
            finally:
                module.N.prove_norm = honest
        if kind == "verified-flip":
            comm, self.comm = self.comm, _FlipGather(self.comm)
            try:
                return aggregate(self, contributions, weights, noise)
            finally:
                self.comm = comm
        return aggregate(self, contributions, weights, noise)

    module.VerifiedAggregator.aggregate = deviating


def _patch_intake(module):  # type: ignore[no-untyped-def]
    get = module.OwnerIntake.GetRound
    close_round = module.OwnerIntake.close_round

    def withheld(self):  # type: ignore[no-untyped-def]
        t = self._round.t
        present, explicit = close_round(self)
        kind, _, arg = SCHEDULE.partition(":")
        if kind == "drop-owner" and t == int(arg) and explicit:
            o = min(explicit)
            present, explicit = present - {o}, {k: v for k, v in explicit.items() if k != o}
        return present, explicit

    def altered(self, request, context):  # type: ignore[no-untyped-def]
        reply = get(self, request, context)
        kind, _, arg = SCHEDULE.partition(":")
        if kind == "serve-altered" and request.round == int(arg) and reply.state:
            data = bytearray(reply.state)
            data[0] ^= 1
            reply.state = bytes(data)
        return reply

    module.OwnerIntake.GetRound = altered
    module.OwnerIntake.close_round = withheld


def _patch_unanimous(module):  # type: ignore[no-untyped-def]
    decide = module.UnanimousRelease.decide
    verdict_for = module.UnanimousRelease.verdict_for

    def counted(self, comm, what, value):  # type: ignore[no-untyped-def]
        _state["verdicts"] += 1
        return decide(self, comm, what, value)

    def split(self, dst, what, me, digest):  # type: ignore[no-untyped-def]
        kind, _, arg = SCHEDULE.partition(":")
        if kind == "verdict-split" and _state["verdicts"] == int(arg) and dst == 0:
            digest = bytes(32)  # another value, under a valid signature
        return verdict_for(self, dst, what, me, digest)

    module.UnanimousRelease.decide = counted
    module.UnanimousRelease.verdict_for = split


PATCHES = {"parties.owner.intake": _patch_intake, "mpc_erm.mpc.unanimous": _patch_unanimous,
           "mpc_erm.mpc.transport.endpoint": _patch_endpoint, "mpc_erm.mpc.aggregator": _patch_aggregator,
           "mpc_erm.mpc.agreement": _patch_agreement, "mpc_erm.mpc.verified_aggregator": _patch_verified}


if SCHEDULE:
    patch_on_import(PATCHES)
