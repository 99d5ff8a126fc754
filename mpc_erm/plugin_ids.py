"""The spelling of model-plugin identifiers, in one torch-free place: the job file's ``model.plugin``
and ``model.plugin_digest`` (mpc_erm.spec), a party's ``[models.<id>] entry_point``
(parties.config), the network name ``plugin:<id>`` (mpc_erm.models.networks) and the loader
(mpc_erm.models.plugins) all read these. A party's config is validated without importing torch,
so they cannot live in the models package."""

from __future__ import annotations

import re

__all__ = ["DIGEST", "DIGEST_RE", "ENTRY_POINT", "ENTRY_POINT_RE", "PLUGIN_ID", "PLUGIN_ID_RE", "PLUGIN_NAME_RE"]

#: a plugin's id in a job file and a party's config (the same alphabet as member names)
PLUGIN_ID = r"[a-z0-9][a-z0-9_-]{0,62}"
#: "package.module:function", installed at the party
ENTRY_POINT = r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*"
#: the sha256 of the entry point's module source
DIGEST = r"sha256:[0-9a-f]{64}"

PLUGIN_ID_RE = re.compile(PLUGIN_ID)
ENTRY_POINT_RE = re.compile(ENTRY_POINT)
DIGEST_RE = re.compile(DIGEST)
PLUGIN_NAME_RE = re.compile(f"plugin:{PLUGIN_ID}")  # a network's name in its spec and bundle
