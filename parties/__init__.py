"""The members' processes: what a compute party and a data owner run next to their data.

- The **party daemon**: job control over gRPC + mTLS (``daemon``, wiring ``admission``,
  ``agreement``, ``supervision``, ``rendezvous`` and ``servicer``), the durable job store
  (``job_store``), one worker process per job (``worker``, behind the ``context`` contract: the
  job's session in ``session``, its spend records in ``spend``), the ``party``/``dealer`` commands
  (``cli``).
- The **data owner** (``owner``, a package): no daemon; ``owner join`` runs its side of one job.
- What both keep: the config (``config``), the privacy-budget ledger (``ledger``), the audit log
  (``audit``), their rows (``rows``), the caller policy of every server (``callers``).

Nothing is imported here: ``mpc-erm budget show`` and the config checks must stay light.
"""
