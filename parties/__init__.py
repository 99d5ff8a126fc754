"""The party daemon: job control over gRPC + mTLS (``daemon``, wiring ``admission``, ``supervision``,
``rendezvous`` and ``servicer``), the durable job store (``jobs``), one worker process per job
(``worker``, behind the ``context`` contract), the config (``config``) and the privacy-budget
ledger (``ledger``).

Nothing is imported here: ``mpc-erm budget show`` and the config checks must stay light.
"""
