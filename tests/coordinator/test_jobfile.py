"""The job file refuses nonsense before anything runs, one line per problem naming the field."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import pytest
import tomllib

from mpc_erm.jobs.jobfile import JobFile, JobFileError, _toml_value, load_job_file, parse_job_file
from mpc_erm.spec import NETWORK_MODEL_FIELDS, NETWORK_TRAINING_FIELDS, JobSpec

EXAMPLES = Path(__file__).resolve().parents[2] / "coordinator" / "examples"
KNOWN = {"alice", "bob", "carol", "dave", "dealer"}

BASE = """\
method = "gradient"

[job]
name = "test-job"
dataset = "adult"
parties = ["alice", "bob", "carol"]
trust = "dealer"
dealer = "dealer"

[model]
name = "logistic"
lam = 0.001

[privacy]
epsilon = 1.0
delta = 1e-5

[training]
iterations = 10
learning_rate = 0.5
"""

REPLICATED = ('trust = "dealer"\ndealer = "dealer"', 'trust = "replicated"')
OUTPUT = ('method = "gradient"', 'method = "output"')

# (edits applied to BASE as (old, new) replacements, expected "<field>: <reason>" fragment)
BAD = [
    ([('dealer = "dealer"', 'dealer = "dealer"\nsecurity = "malicious"')],
     'job.security: "malicious" cannot run with trust = "dealer": the dealer makes every product\'s correlated '
     "randomness and is trusted by construction"),
    ([REPLICATED, ('trust = "replicated"', 'trust = "replicated"\nsecurity = "malicious"')],
     'privacy.noise: security = "malicious" needs noise = "distributed"'),
    ([REPLICATED, ('trust = "replicated"', 'trust = "replicated"\nsecurity = "malicious"'),
      ('parties = ["alice", "bob", "carol"]', 'parties = ["alice", "bob", "carol", "dave"]')],
     'job.security: "malicious" runs on exactly three compute parties'),
    ([REPLICATED, ('trust = "replicated"', 'trust = "replicated"\nsecurity = "malicious"\ntest_no_noise = true'),
      ("delta = 1e-5", 'delta = 1e-5\nnoise = "distributed"')],
     'job.test_no_noise: not with security = "malicious"'),
    ([('dealer = "dealer"', 'dealer = "dealer"\nsecurity = "honest"')], "job.security: must be"),
    ([("epsilon = 1.0", "epsilon = 0.0")], "privacy.epsilon: must be > 0"),
    ([("epsilon = 1.0", "epsilon = -1.0")], "privacy.epsilon: must be > 0"),
    ([("epsilon = 1.0", "epsilon = inf")], "privacy.epsilon: must be finite"),
    ([("epsilon = 1.0", "epsilon = nan")], "privacy.epsilon: must be finite"),
    ([("epsilon = 1.0", 'epsilon = "1.0"')], "privacy.epsilon: must be a number, got a string"),
    ([("epsilon = 1.0", "epsilon = true")], "privacy.epsilon: must be a number, got a boolean"),
    ([("epsilon = 1.0\n", "")], "privacy.epsilon: required"),
    ([("delta = 1e-5", "delta = 1.0")], "privacy.delta: must be < 1"),
    ([("delta = 1e-5", "delta = -1e-5")], "privacy.delta: must be >= 0"),
    ([("delta = 1e-5\n", "")], "privacy.delta: gradient perturbation (Gaussian) needs δ > 0"),
    ([OUTPUT, ("delta = 1e-5", 'mechanism = "gaussian"')], "privacy.delta: the Gaussian mechanism needs δ > 0"),
    ([OUTPUT, ("lam = 0.001", "lam = 0.0")], "model.lam: output perturbation needs λ > 0"),
    ([OUTPUT], "privacy.mechanism: 'l2_laplace' (the simulator's default) is not sampled inside the MPC"),
    ([OUTPUT, ("delta = 1e-5", 'delta = 1e-5\nmechanism = "l2_laplace"')], "privacy.mechanism: 'l2_laplace'"),
    ([("lam = 0.001", "lam = -1.0")], "model.lam: must be >= 0"),
    ([("delta = 1e-5", "delta = 1e-5\nclip = inf")], "privacy.clip: must be finite"),
    ([("delta = 1e-5", "delta = 1e-5\nclip = 0.0")], "privacy.clip: must be > 0"),
    ([("delta = 1e-5", 'delta = 1e-5\naccountant = "moments"')], "privacy.accountant: must be 'gdp', 'zcdp'"),
    # issue 13: what the privacy plan cannot honour is refused at parse, naming the field
    ([("delta = 1e-5", 'delta = 1e-5\naccountant = "gdp"')], "privacy.accountant: 'gdp' is exact for the continuous"),
    ([("delta = 1e-5", 'delta = 1e-5\naccountant = "pld"')], "privacy.accountant: 'pld' is exact for the continuous"),
    ([("delta = 1e-5", 'delta = 1e-5\nadjacency = "add_remove"')], "privacy.public_n: add/remove adjacency keeps"),
    ([("delta = 1e-5", "delta = 1e-5\npublic_n = 30000")], "privacy.public_n: only for adjacency = 'add_remove'"),
    ([("delta = 1e-5", 'delta = 1e-5\nadjacency = "add_remove"\npublic_n = 30000'),
      ("iterations = 10", 'iterations = 10\nweighting = "thesis"')], "training.weighting: the thesis's weights"),
    ([OUTPUT, ("delta = 1e-5", 'delta = 1e-5\nmechanism = "gaussian"'), ("iterations = 10", "ls_sigma = 1.0")],
     "training.ls_sigma: Laplacian smoothing applies to gradient rounds"),
    ([OUTPUT, ("delta = 1e-5", 'delta = 0.0\nmechanism = "laplace_thesis"')],
     "privacy.delta: the in-MPC discrete Laplace"),
    ([('"carol"]', '"mallory"]')], "job.parties: unknown party 'mallory'"),
    ([('"carol"]', '"alice"]')], "job.parties: duplicate party 'alice'"),
    ([('"carol"]', '"Alice"]')], "job.parties: duplicate party 'Alice'"),
    ([('["alice", "bob", "carol"]', '["alice"]')], "job.parties: needs 2 to 16 parties, got 1"),
    ([('["alice", "bob", "carol"]', str([f"p{i}" for i in range(17)]).replace("'", '"'))],
     "job.parties: needs 2 to 16 parties, got 17"),
    ([('["alice", "bob", "carol"]', '"alice"')], "job.parties: must be an array, got a string"),
    ([('"carol"]', '"car ol"]')], "job.parties[2]: must be 1-64 characters from [A-Za-z0-9._-]"),
    ([('"carol"]', '"ca"]')], "job.parties[2]: 'ca' is reserved"),
    ([REPLICATED, ('"carol"]', '"carol", "dave"]')], 'job.parties: trust = "replicated" needs exactly 3, got 4'),
    ([REPLICATED, ('"bob", "carol"]', '"bob"]')], 'job.parties: trust = "replicated" needs exactly 3, got 2'),
    ([('trust = "dealer"', 'trust = "replicated"')], 'job.dealer: only for trust = "dealer"'),
    ([('dealer = "dealer"\n', "")], 'job.dealer: required when trust = "dealer"'),
    ([('dealer = "dealer"', 'dealer = "alice"')], "job.dealer: 'alice' is also a party"),
    ([('dealer = "dealer"', 'dealer = "eve"')], "job.dealer: unknown identity 'eve'"),
    ([('trust = "dealer"', 'trust = "honest"')], "job.trust: must be 'dealer' or 'replicated', got 'honest'"),
    ([('trust = "dealer"', 'trust = "dealer"\ndevice = "tpu"')], "job.device: must be 'cpu', 'cuda' or 'auto'"),
    ([('name = "test-job"', 'name = "My Job"')], "job.name: must be a slug"),
    ([('dataset = "adult"', 'dataset = "../adult"')], "job.dataset: must be a data set id"),
    ([('dataset = "adult"\n', "")], "job.dataset: required"),
    ([('trust = "dealer"', 'trust = "dealer"\ncolour = "red"')], "job.colour: unknown key"),
    ([("[job]", "[jbo]")], "jbo: unknown key; did you mean 'job'?"),
    ([("iterations = 10", "iteratons = 10")], "training.iteratons: unknown key; did you mean 'iterations'?"),
    ([("[training]", "[optimizer]")], "optimizer: unknown key; expected one of federated, job, method, model"),
    # what a user of Opacus or TF-Privacy guesses gets this file's words for it
    ([("iterations = 10", "epochs = 10")], "training.epochs: unknown key; rounds are training.iterations"),
    ([("iterations = 10", "batch_size = 32")], "training.batch_size: applies to networks (DP-SGD) only"),
    ([("[training]", "batch_size = 32\n[training]")], "privacy.batch_size: unknown key; training.batch_size: "
                                                        "exactly b of the parties' pooled rows"),
    ([("iterations = 10", "noise_multiplier = 1.1")], "training.noise_multiplier: unknown key; the plan chooses it"),
    ([("iterations = 10", "iterations = 0")], "training.iterations: must be >= 1"),
    ([("iterations = 10", "iterations = 10.0")], "training.iterations: must be an integer, got a number"),
    ([("learning_rate = 0.5", "learning_rate = -0.1")], "training.learning_rate: must be > 0"),
    ([('method = "gradient"', 'method = "newton"')], "method: must be 'output' or 'gradient', got 'newton'"),
    ([('method = "gradient"', 'method = "dpsgd"')], "method: must be 'output' or 'gradient', got 'dpsgd'; DP-SGD, "
                                                     "DP-Adam and DP-SRM are method = 'gradient' with a network "
                                                     "[model]"),
    ([('method = "gradient"\n', "")], "method: required"),
    ([('name = "logistic"', 'name = "svm"')],
     "model.name: must be 'logistic', 'ridge', 'huber_svm', 'softmax', 'mlp', 'mnist_cnn', 'cifar_cnn', "
     "'tf_cifar_cnn', 'char_lstm' or 'plugin'"),
    ([('name = "logistic"', 'name = "softmax"')], "model.n_classes: required for softmax"),
    ([("lam = 0.001", "lam = 0.001\nn_classes = 3")], "model.n_classes: only for softmax"),
    ([('method = "gradient"', 'method = "gradient"\nmodel = 3'), ("[model]\n", "[unused]\n")],
     "model: must be a table, got an integer"),
    ([('method = "gradient"', 'method = "gradient"\nseed = 3')], "seed: simulation only"),
    ([("[privacy]", "[privacy")], "invalid TOML"),
]


def _text(edits: list[tuple[str, str]]) -> str:
    text = BASE
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


@pytest.mark.parametrize(("edits", "fragment"), BAD, ids=[frag for _, frag in BAD])
def test_bad_job_files_name_the_field(tmp_path: Path, edits: list[tuple[str, str]], fragment: str) -> None:
    path = tmp_path / "job.toml"
    path.write_text(_text(edits))
    with pytest.raises(JobFileError) as err:
        load_job_file(path, KNOWN)
    lines = str(err.value).splitlines()
    assert all(line.startswith(f"{path}: ") for line in lines), lines
    assert any(line.startswith(f"{path}: {fragment}") for line in lines), lines


def test_the_base_file_is_good_and_every_problem_gets_a_line(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(BASE)
    assert load_job_file(path, KNOWN).job.parties == ("alice", "bob", "carol")
    path.write_text(_text([("epsilon = 1.0", "epsilon = 0.0"), ("iterations = 10", "iterations = 0"),
                           ("learning_rate = 0.5", 'learning_rate = "fast"')]))
    with pytest.raises(ValueError) as err:  # JobFileError is a ValueError: the CLI's guard prints it
        load_job_file(path)
    assert str(err.value).splitlines() == [
        f"{path}: privacy.epsilon: must be > 0",
        f"{path}: training.iterations: must be >= 1",
        f"{path}: training.learning_rate: must be a number, got a string",
    ]


def test_unknown_names_pass_without_a_registry_and_missing_file_is_one_line(tmp_path: Path) -> None:
    assert parse_job_file(_text([('"carol"]', '"mallory"]')])).job.parties[-1] == "mallory"
    with pytest.raises(JobFileError, match=r"nope\.toml: cannot read: No such file"):
        load_job_file(tmp_path / "nope.toml")


@pytest.mark.parametrize("name", ["output-adult.toml", "gradient-adult.toml"])
def test_examples_load_and_round_trip(tmp_path: Path, name: str) -> None:
    job = load_job_file(EXAMPLES / name, known_parties={"alice", "bob", "carol", "dealer"})
    assert job.job.dataset == "adult" and job.job.parties == ("alice", "bob", "carol") and job.job.dealer == "dealer"
    assert job.spec.privacy.epsilon == 1.0 and job.spec.privacy.delta == 1e-7
    assert job.spec.method == name.split("-")[0]
    (tmp_path / name).write_text(job.to_toml())
    again = load_job_file(tmp_path / name)
    assert again == job and again.spec_digest() == job.spec_digest()


def test_round_trip_of_a_replicated_softmax_job() -> None:
    job = parse_job_file(_text([REPLICATED, ('name = "logistic"', 'name = "softmax"\nn_classes = 10'),
                                ("delta = 1e-5",
                                 'delta = 1e-5\nclip = 0.25\nadjacency = "add_remove"\npublic_n = 30000'),
                                ('trust = "replicated"', 'trust = "replicated"\ndevice = "cuda"')]))
    text = job.to_toml()
    assert parse_job_file(text) == job and "dealer" not in text and "seed" not in text


def test_digest_ignores_layout_and_key_order() -> None:
    job = parse_job_file(BASE)
    shuffled = """
        # same job, tables and keys reordered, odd spacing, defaults spelled out
        method="gradient"
        [training]
        learning_rate   = 5e-1
        weighting = "pooled"
        iterations = 10
        [privacy]
        delta = 0.00001
        epsilon = 1
        [model]
        lam = 1e-3
        name = 'logistic'
        [job]
        dealer = "dealer"
        trust = "dealer"
        parties = [ "alice", "bob",
                    "carol", ]
        dataset = "adult"
        name = "test-job"
    """
    other = parse_job_file(shuffled)
    assert other == job and other.spec_digest() == job.spec_digest()
    assert job.spec_digest() == hashlib.sha256(job.canonical_json().encode()).hexdigest()


ALTERNATIVES = {("job", "trust"): None, ("job", "device"): "cpu", ("spec", "method"): "output",
                ("spec", "model", "name"): "ridge", ("spec", "privacy", "mechanism"): "gaussian",
                ("spec", "privacy", "accountant"): "zcdp", ("spec", "privacy", "adjacency"): "add_remove",
                ("spec", "training", "weighting"): "thesis", ("spec", "privacy", "noise"): "distributed"}


def _leaves(tree: dict, prefix: tuple = ()) -> list[tuple]:
    out = []
    for key, value in tree.items():
        out += _leaves(value, prefix + (key,)) if isinstance(value, dict) else [(prefix + (key,), value)]
    return out


def test_the_default_security_model_is_semi_honest_and_naming_it_keeps_the_digest(tmp_path: Path) -> None:
    plain = parse_job_file(BASE)
    named = parse_job_file(BASE.replace('dealer = "dealer"', 'dealer = "dealer"\nsecurity = "semi-honest"'))
    assert plain.job.security == named.job.security == "semi-honest"
    assert plain.spec_digest() == named.spec_digest() and "security" not in plain.to_toml()


def test_a_malicious_job_parses_with_three_replicated_parties_and_distributed_noise_and_is_digested() -> None:
    text = BASE.replace('trust = "dealer"\ndealer = "dealer"', 'trust = "replicated"\nsecurity = "malicious"') \
        .replace("delta = 1e-5", 'delta = 1e-5\nnoise = "distributed"')
    job = parse_job_file(text)
    assert job.job.security == "malicious"
    honest = parse_job_file(text.replace('security = "malicious"', ""))
    assert job.spec_digest() != honest.spec_digest() and 'security = "malicious"' in job.to_toml()


def test_a_malicious_job_takes_data_owners_sampling_themselves_but_not_the_secret_shuffle() -> None:
    text = BASE.replace('trust = "dealer"\ndealer = "dealer"',
                        'trust = "replicated"\nsecurity = "malicious"\nfeatures = 5\nowners = ["o1", "o2"]') \
        .replace("delta = 1e-5", 'delta = 1e-5\nnoise = "distributed"\nadjacency = "add_remove"\npublic_n = 10')
    fed = text.replace("iterations = 10", "iterations = 10\nsampling_rate = 0.5").replace(
        'name = "logistic"', 'name = "softmax"\nn_classes = 3').replace("public_n = 10", "public_n = 2\nclip = 1.0") + \
        '\n[federated]\nlocal_epochs = 1\nlocal_batch = 4\nlocal_lr = 0.1\nsampling = "{}"\n'
    assert parse_job_file(text).job.owners == ("o1", "o2")
    assert parse_job_file(fed.format("poisson")).job.security == "malicious"
    with pytest.raises(JobFileError) as err:
        parse_job_file(fed.format("uniform"))
    assert 'federated.sampling: security = "malicious" needs "poisson"' in str(err.value)


def test_digest_changes_when_any_field_changes() -> None:
    job = load_job_file(EXAMPLES / "gradient-adult.toml")
    base = job.model_dump(mode="json")
    digests = {job.spec_digest()}
    changed = 0
    for path, value in _leaves(base):
        if value is None or path in (("job", "trust"), ("job", "owners"), ("job", "security")):
            continue  # owners: test_a_job_with_owners_loads_keeps_the_old_digests_and_refuses_what_it_cannot_run;
            # security: test_a_malicious_job_parses_with_three_replicated_parties_and_distributed_noise_...
        if path[:2] == ("spec", "model") and path[2] in NETWORK_MODEL_FIELDS or \
                path[:2] == ("spec", "training") and path[2] in NETWORK_TRAINING_FIELDS:
            continue  # a linear job must leave them at their defaults (test_network_fields_enter_the_digest)
        if path in ALTERNATIVES:
            new = ALTERNATIVES[path]
        elif isinstance(value, list):
            new = [*value, "dave"]
        elif isinstance(value, str):
            new = value + "x"
        elif isinstance(value, int):
            new = value + 1
        else:
            new = value * 2 if value else 0.5
        data = copy.deepcopy(base)
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = new
        if path == ("spec", "method"):  # an output job must name a mechanism sampled in the MPC
            data["spec"]["privacy"]["mechanism"] = "laplace_thesis"
            data["spec"]["training"]["ls_sigma"] = 0.0  # and smooths nothing
        if path == ("spec", "privacy", "adjacency"):  # add/remove divides by a public count
            data["spec"]["privacy"]["public_n"] = 30000
        digests.add(JobFile.model_validate(data).spec_digest())
        changed += 1
    replicated = copy.deepcopy(base)
    replicated["job"].update(trust="replicated", dealer=None)
    digests.add(JobFile.model_validate(replicated).spec_digest())
    assert changed >= 20 and len(digests) == changed + 2


def test_the_digest_is_computed_once_and_a_changed_copy_computes_its_own() -> None:
    """The digest is kept after its first computation (a job of 50,000 owners hashes a megabyte,
    asked several times by each owner); a copy with another field (``model_copy(update=…)``, the
    one way to change a frozen job) is not the same job and must not keep it."""
    job = load_job_file(EXAMPLES / "gradient-adult.toml")
    first = job.spec_digest()
    assert job.spec_digest() is first  # kept
    other = job.model_copy(update={"spec": job.spec.model_copy(update={"seed": (job.spec.seed or 0) + 1})})
    assert other.spec_digest() == hashlib.sha256(other.canonical_json().encode()).hexdigest() != first
    assert job.model_copy().spec_digest() == copy.deepcopy(job).spec_digest() == first


@pytest.mark.parametrize("s", ['plain', 'quo"te', "back\\slash", "new\nline\ttab", "del\x7f", "ünï ✓ 😀"])
def test_toml_strings_round_trip(s: str) -> None:
    assert tomllib.loads(f"x = {_toml_value(s)}")["x"] == s


def test_network_fields_enter_the_digest() -> None:
    """A network job's own fields (skipped on the linear job above) change its digest too."""
    base = {"method": "gradient",
            "model": {"name": "mnist_cnn", "input_shape": [1, 28, 28], "n_classes": 10},
            "privacy": {"epsilon": 1.0, "delta": 1e-5, "clip": 1.0, "adjacency": "add_remove", "public_n": 60000},
            "training": {"iterations": 10, "sampling_rate": 0.01}}
    changes = {"input_shape": [1, 32, 32], "hidden": [64], "init_seed": 5, "sampling_rate": 0.02, "optimizer": "adam",
               "momentum": 0.9, "adam_betas": [0.8, 0.99], "schedule": "step", "schedule_step": 5,
               "schedule_gamma": 0.5}
    digests = {JobSpec.model_validate(base).digest()}
    for name, value in changes.items():
        section = "model" if name in NETWORK_MODEL_FIELDS else "training"
        assert name in NETWORK_MODEL_FIELDS + NETWORK_TRAINING_FIELDS
        spec = copy.deepcopy(base)
        spec[section][name] = value
        digests.add(JobSpec.model_validate(spec).digest())
    assert len(digests) == len(changes) + 1


def test_a_job_with_owners_loads_keeps_the_old_digests_and_refuses_what_it_cannot_run() -> None:
    job = load_job_file(EXAMPLES / "gradient-owners.toml", known_parties={"alice", "bob", "carol"})
    assert len(job.job.owners) == 6 and job.job.features == 30 and job.job.round_deadline_s == 30.0
    assert parse_job_file(job.to_toml()) == job  # round trip, owners included
    other = parse_job_file(job.to_toml().replace('"clinic-006"', '"clinic-007"'))
    assert other.spec_digest() != job.spec_digest()  # the owner list is part of what every member agrees on
    plain = load_job_file(EXAMPLES / "gradient-adult.toml")
    assert "owners" not in plain.canonical_json() and "owners" not in plain.to_toml()  # digests as before
    text = (EXAMPLES / "gradient-owners.toml").read_text()
    bad = {
        'name = "logistic"': ('name = "mlp"\nhidden = [8]\ninput_shape = [30]\nn_classes = 2',
                              "model.name: gradient rounds with owners train a linear model"),
        'adjacency = "add_remove"': ('adjacency = "replace"',
                                     'privacy.adjacency: a job with owners needs "add_remove"'),
        "features = 30 ": ("", "features: required with owners"),
        '"clinic-006"]': ('"alice"]', "owners: 'alice' is also a compute party"),
        'round_deadline_s = 30.0': ("round_deadline_s = 0.01", "round_deadline_s: 0.1 to 3600 seconds"),
    }
    for old, (new, why) in bad.items():
        assert old in text, old
        with pytest.raises(JobFileError, match=why):
            parse_job_file(text.replace(old, new))
    with pytest.raises(JobFileError, match="duplicate owner 'clinic-001'"):
        parse_job_file(text.replace('"clinic-002"', '"clinic-001"'))
    with pytest.raises(JobFileError, match="features: only with owners"):
        parse_job_file((EXAMPLES / "gradient-adult.toml").read_text().replace('device = "auto"',
                                                                               'device = "auto"\nfeatures = 3'))


def test_an_output_job_with_owners_loads_and_keeps_its_digest_on_a_round_trip() -> None:
    job = load_job_file(EXAMPLES / "output-owners.toml", known_parties={"alice", "bob", "carol"})
    assert job.spec.method == "output" and len(job.job.owners) == 6 and job.spec.privacy.public_n == 500
    again = parse_job_file(job.to_toml())
    assert again == job and again.spec_digest() == job.spec_digest()
    with pytest.raises(JobFileError, match='privacy.adjacency: a job with owners needs "add_remove"'):
        parse_job_file(job.to_toml().replace('adjacency = "add_remove"', 'adjacency = "replace"')
                       .replace("public_n = 500", ""))


def test_a_federated_job_needs_owners_and_keeps_other_digests() -> None:
    job = load_job_file(EXAMPLES / "federated-owners.toml", known_parties={"alice", "bob", "carol"})
    f = job.spec.federated
    assert f is not None and (f.local_epochs, f.local_batch, f.local_lr, f.local_lr_decay) == (5, 10, 0.1, 0.99)
    assert parse_job_file(job.to_toml()) == job  # round trip: [federated], sampling_rate, a linear model
    assert f.send_after_s == 20.0
    when_ready = parse_job_file(job.to_toml().replace("send_after_s = 20.0\n", ""))
    assert when_ready.spec.federated.send_after_s is None and "send_after_s" not in when_ready.canonical_json()
    assert when_ready.spec_digest() != job.spec_digest()  # the send time is part of what every member agrees on
    plain = load_job_file(EXAMPLES / "gradient-owners.toml")
    assert "federated" not in plain.canonical_json() and "federated" not in plain.spec.canonical_json()
    text = (EXAMPLES / "federated-owners.toml").read_text()
    bad = {
        "public_n = 10 ": ("public_n = 500 ", "privacy.public_n: a federated job's unit of privacy is the owner"),
        "clip = 0.4 ": ("", "privacy.clip: required for a federated job"),
        'name = "softmax"': ('name = "logistic"', "model.name: a federated job trains 'softmax' or a built-in"),
        "local_epochs = 5 ": ("local_epochs = 0 ", "federated.local_epochs: must be >= 1"),
        "send_after_s = 20.0": ("send_after_s = 0", "federated.send_after_s: must be > 0"),
        "[federated]": ("[training.x]", "training.x: unknown key"),
    }
    for old, (new, why) in bad.items():
        assert old in text, old
        with pytest.raises(JobFileError, match=why):
            parse_job_file(text.replace(old, new))
    without_owners = "\n".join(line for line in text.splitlines() if not line.startswith(("owners", '          "clinic',
                                                                                          "features",
                                                                                          "round_deadline")))
    with pytest.raises(JobFileError, match="federated: a federated job runs with data owners"):
        parse_job_file(without_owners)
    net = text.replace('name = "softmax"', 'name = "mlp"\ninput_shape = [29]\nhidden = [8]')
    with pytest.raises(JobFileError, match=r"job.features: model.input_shape \[29\] takes 29 values per row, not 30"):
        parse_job_file(net)
    assert parse_job_file(net.replace("[29]", "[30]")).spec.model.hidden == (8,)
    with pytest.raises(JobFileError, match="training.optimizer: a federated job's local steps are set in"):
        parse_job_file(text.replace("ls_sigma = 1.0", 'ls_sigma = 1.0\noptimizer = "adam"'))


def test_a_softmax_job_may_leave_its_class_count_to_the_schema_it_pins() -> None:
    """Without job.schema_sha256 the class count is required, and the error says how to avoid it;
    with it, the file parses, `classes_from_schema` says so, and `with_schema_classes` fills it in
    under the same digest (what a party trains); a job that gives the count keeps it."""
    softmax = BASE.replace('name = "logistic"', 'name = "softmax"')
    with pytest.raises(JobFileError, match=r"model.n_classes: required for softmax \(or pin the parties' schema"):
        parse_job_file(softmax, known_parties=KNOWN)
    pinned = softmax.replace('trust = "dealer"', 'trust = "dealer"\nschema_sha256 = "' + "a" * 64 + '"')
    jf = parse_job_file(pinned, known_parties=KNOWN)
    assert jf.classes_from_schema and jf.spec.model.n_classes is None
    filled = jf.with_schema_classes(4)
    assert filled.spec.model.n_classes == 4 and filled.spec_digest() == jf.spec_digest()
    assert not filled.classes_from_schema and filled.with_schema_classes(7) is filled
