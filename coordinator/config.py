"""The coordinator's TOML configuration (``mpc-erm job … --config coordinator.toml``).

Who the coordinator is (its certificate, which each party's policy must list in
``allowed_coordinators``) and where the members' daemons listen, by certificate name::

    timeout_s = 30                 # per call (a submission gets twice this)

    [identity]
    name = "coordinator"
    cert = "pki/coordinator.crt"
    key = "pki/coordinator.key"
    ca = "pki/ca.crt"

    [parties]                      # party name -> daemon address
    alice = "127.0.0.1:7101"
    bob = "127.0.0.1:7102"

    [dealers]                      # dealer name -> daemon address (for trust = "dealer" jobs)
    dealer = "127.0.0.1:7100"

Validated like a party config: unknown keys are errors, every problem names its field, relative
paths are resolved against the config file's directory.
"""

from __future__ import annotations

import os

from pydantic import Field, model_validator

from parties.config import ConfigModel, HostPort, IdentityConfig, Name, load_model

__all__ = ["CoordinatorConfig", "load_coordinator_config"]


class CoordinatorConfig(ConfigModel):
    identity: IdentityConfig
    parties: dict[Name, HostPort] = Field(min_length=1)
    dealers: dict[Name, HostPort] = Field(default_factory=dict)
    timeout_s: float = Field(30.0, strict=True, gt=0, le=3600, allow_inf_nan=False)

    @model_validator(mode="after")
    def _distinct(self) -> CoordinatorConfig:
        both = sorted(set(self.parties) & set(self.dealers))
        if both:
            raise ValueError(f"dealers: {', '.join(both)} also listed under parties; a name has one role")
        if self.identity.name in self.parties or self.identity.name in self.dealers:
            raise ValueError(f"identity.name: {self.identity.name!r} is also a party or dealer name")
        return self

    def members(self) -> dict[str, tuple[str, str]]:
        """name -> (role, address), parties first."""
        return {**{n: ("party", a) for n, a in self.parties.items()},
                **{n: ("dealer", a) for n, a in self.dealers.items()}}


def load_coordinator_config(path: str | os.PathLike[str]) -> CoordinatorConfig:
    """Read and validate a coordinator config; every problem is raised together as a ConfigError."""
    return load_model(path, CoordinatorConfig)
