"""The data owner's role, in one package: an owner runs no daemon and no MPC; it holds its rows,
its own ledger and audit log, and takes part in a job run by compute parties by sending additive
shares of its contribution.

- :mod:`.process`: ``owner join`` / ``owner fetch`` — consent, plan, rows, the job's run
  (:mod:`mpc_erm.runs`) with the owner's reveal guard, results;
- :mod:`.cli`: the ``mpc-erm owner`` commands;
- :mod:`.failures`: how an owner's run ends (one line, an exit code) and the watch that notices a
  job ended at the compute parties;
- :mod:`.shares`, :mod:`.sample`: an owner's additive shares on the grid, and its bits of the
  compute parties' secret owner sample;
- :mod:`.intake`, :mod:`.rounds`: the compute party's intake server and the owner's client, and the
  aggregators both sides run a round with;
- :mod:`.serving`: a compute party's job with data owners (the run fed by its intake);
- :mod:`.release`: the last release a compute party keeps for owners that read it late.

Nothing is imported here: the CLI stays light.
"""
