"""`mpc-erm certs init|issue|request|sign|revoke`: the deployment CA, one key + certificate per identity, and
the revocation list.

Why in the CLI: each organisation's operator must be able to mint and inspect its material
without writing Python, and must not clobber a CA or a key by accident (hence `--force`).
`issue` makes key and certificate in one go (demo, single organisation); `request` + `sign`
keep each organisation's private key on its own machine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import cast

import click
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from mpc_erm.mpc import pki
from parties.config import check_name as _config_name

_DIR = click.option(
    "--dir", "dir_", required=True, type=click.Path(file_okay=False, path_type=Path),
    help="certificate directory (holds ca.crt, ca.key, <name>.crt, <name>.key)",
)
_DAYS = click.option("--days", type=int, default=365, show_default=True, help="validity in days")
_JSON = click.option("--json", "as_json", is_flag=True, help="print paths and fingerprints as JSON")
_FORCE = click.option("--force", is_flag=True, help="overwrite existing files")
_NAME = click.option("--name", required=True,
                     help="identity name: lower-case letters, digits, '_' and '-', at most 63 (as configs take it)")
_ROLE = click.option("--role", required=True, type=click.Choice(list(pki.ROLES)), help="what this identity is")
_HOSTS = click.option(
    "--host", "hosts", multiple=True,
    help="DNS name or IP the identity's listener is reached at (repeatable; default localhost, 127.0.0.1, ::1)",
)


def _check_name(name: str) -> None:
    """The name rule of every config (parties.config's ``Name``): a certificate for a name no config
    accepts would be issued only to be refused when its daemon or coordinator starts."""
    try:
        _config_name(name)
    except ValueError as exc:
        raise ValueError(f"--name: {exc}") from None
    pki.validate_name(name, "--name")  # and not a name reserved for the CA's files


def _field_error(exc: ValueError) -> ValueError:
    """Name the flag the user typed, not the Python parameter."""
    msg = str(exc)
    for old, new in (("hosts:", "--host:"), ("csr:", "--csr:")):
        if msg.startswith(old):
            msg = new + msg[len(old) :]
    return ValueError(msg)


def _describe(path: Path) -> dict[str, object]:
    pem = path.read_bytes()
    cert = x509.load_pem_x509_certificate(pem)
    return {
        "path": str(path),
        "sha256_fingerprint": pki.fingerprint(pem),
        "serial": f"{cert.serial_number:x}",
        "not_after": cert.not_valid_after_utc.isoformat(),
    }


@click.group()
def certs() -> None:
    """Create the CA and issue per-identity mTLS certificates (party, dealer, coordinator, owner)."""


@certs.command("init")
@_DIR
@click.option("--name", default="mpc-erm CA", show_default=True, help="the CA's common name")
@_DAYS
@_FORCE
@_JSON
def init(dir_: Path, name: str, days: int, force: bool, as_json: bool) -> None:
    """Create a new CA in DIR (ca.crt, ca.key with mode 0600)."""
    for existing in (dir_ / pki.CA_CERT_FILE, dir_ / pki.CA_KEY_FILE):
        if existing.exists() and not force:
            raise ValueError(
                f"--dir: {existing} already exists; replacing the CA invalidates every certificate it issued "
                "(use --force)"
            )
    if days < 1:
        raise ValueError(f"--days: must be >= 1, got {days}")
    ca = pki.create_ca(name=name, valid_days=days)
    paths = pki.save_ca(ca, dir_)
    info = {"ca": {**_describe(paths.cert), "key": str(paths.key), "name": name}}
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        click.echo(f"CA {name!r} written to {paths.cert} (key {paths.key})")
        click.echo(f"  SHA-256 {info['ca']['sha256_fingerprint']}")


@certs.command("issue")
@_DIR
@_NAME
@_ROLE
@_HOSTS
@_DAYS
@_FORCE
@_JSON
def issue(dir_: Path, name: str, role: str, hosts: tuple[str, ...], days: int, force: bool, as_json: bool) -> None:
    """Issue a key + certificate for NAME signed by the CA in DIR (<name>.crt, <name>.key).

    Convenient for one organisation or a demo; across organisations prefer `request` + `sign`,
    so the CA operator never holds another organisation's private key.
    """
    _check_name(name)
    if days < 1:
        raise ValueError(f"--days: must be >= 1, got {days}")
    files = pki.identity_files(dir_, name)
    for existing in (files.cert, files.key):
        if existing.exists() and not force:
            raise ValueError(f"--name: {existing} already exists (use --force to re-issue)")
    ca = pki.load_ca(dir_)
    try:
        identity = pki.issue_identity(ca, name, cast(pki.Role, role), valid_days=days, hosts=hosts or pki.DEFAULT_HOSTS)
    except ValueError as exc:
        raise _field_error(exc) from None
    paths = pki.save_identity(identity, dir_)
    info = {
        "identity": identity.uri,
        "role": role,
        "name": name,
        "cert": _describe(paths.cert),
        "key": str(paths.key),
        "ca": _describe(paths.ca),
    }
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        click.echo(f"{identity.uri} written to {paths.cert} (key {paths.key})")
        click.echo(f"  SHA-256 {info['cert']['sha256_fingerprint']}  valid until {info['cert']['not_after']}")


@certs.command("request")
@_DIR
@_NAME
@_ROLE
@_FORCE
@_JSON
def request(dir_: Path, name: str, role: str, force: bool, as_json: bool) -> None:
    """Make a key (<name>.key, 0600) and a signing request (<name>.csr) on THIS machine.

    Send only the .csr to the CA operator (`certs sign`); put the returned <name>.crt and ca.crt
    into DIR. The private key never leaves this organisation.
    """
    _check_name(name)
    files = pki.identity_files(dir_, name)
    if files.key.exists() and not force:
        raise ValueError(f"--name: {files.key} already exists (use --force to replace the key)")
    uri = pki.identity_uri(cast(pki.Role, role), name)
    csr_pem, key_pem = pki.create_csr(name, cast(pki.Role, role))
    csr_path, key_path = pki.save_request(dir_, name, csr_pem, key_pem)
    if as_json:
        click.echo(json.dumps({"identity": uri, "csr": str(csr_path), "key": str(key_path)}, indent=2))
    else:
        click.echo(f"key {key_path} and request {csr_path} for {uri}")
        click.echo(f"  send {csr_path.name} to the CA operator; keep {key_path.name} here")


@certs.command("sign")
@_DIR
@click.option("--csr", "csr_path", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="the requester's <name>.csr")
@click.option("--name", required=True, help="the identity name you approve (must match the request)")
@click.option("--role", required=True, type=click.Choice(list(pki.ROLES)), help="the role you approve")
@_HOSTS
@_DAYS
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="where to write <name>.crt and ca.crt (default: the CSR's folder)")
@_FORCE
@_JSON
def sign(dir_: Path, csr_path: Path, name: str, role: str, hosts: tuple[str, ...], days: int,
         out_dir: Path | None, force: bool, as_json: bool) -> None:
    """Sign a request with the CA in DIR; the CA never sees the requester's private key."""
    _check_name(name)
    if days < 1:
        raise ValueError(f"--days: must be >= 1, got {days}")
    out = out_dir or csr_path.parent
    files = pki.identity_files(out, name)
    if files.cert.exists() and not force:
        raise ValueError(f"--name: {files.cert} already exists (use --force to re-sign)")
    ca = pki.load_ca(dir_)
    try:
        cert_pem = pki.sign_csr(ca, csr_path.read_bytes(), name, cast(pki.Role, role), valid_days=days,
                                hosts=hosts or pki.DEFAULT_HOSTS)
    except ValueError as exc:
        raise _field_error(exc) from None
    paths = pki.save_certificate(out, name, cert_pem, ca.cert_pem)
    info = {
        "identity": pki.identity_uri(cast(pki.Role, role), name),
        "cert": _describe(paths.cert),
        "ca": _describe(paths.ca),
    }
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        click.echo(f"{info['identity']} signed: {paths.cert} (return it with {paths.ca})")
        click.echo(f"  SHA-256 {info['cert']['sha256_fingerprint']}  valid until {info['cert']['not_after']}")


@certs.command("revoke")
@_DIR
@click.option("--cert", "cert_paths", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="a certificate to revoke (repeatable)")
@click.option("--serial", "serials", multiple=True,
              help="a serial number to revoke, hex as `certs` prints it (repeatable)")
@click.option("--crl", "crl_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="the revocation list to write; its serials are kept (default: DIR/crl.pem)")
@click.option("--days", type=int, default=30, show_default=True,
              help="the list is valid this long; daemons refuse a stale list, so re-run before it lapses")
@_JSON
def revoke(dir_: Path, cert_paths: tuple[Path, ...], serials: tuple[str, ...], crl_path: Path | None, days: int,
           as_json: bool) -> None:
    """Add certificates to the CA's revocation list (CRL) and re-sign it.

    Give the list to every daemon (`[identity] crl = "…"` in its config): a daemon, and each job's
    share transport, refuses a revoked peer by serial. With no --cert/--serial it only re-signs
    the list for another --days (a list past its next update is refused, fail closed)."""
    if days < 1:
        raise ValueError(f"--days: must be >= 1, got {days}")
    ca = pki.load_ca(dir_)
    path = crl_path or dir_ / "crl.pem"
    kept: set[int] = set()
    if path.exists():  # an expired list still names what was revoked: keep its serials
        try:
            kept = set(pki.revoked_serials_from_crl(path.read_bytes(), ca.cert_pem, check_validity=False))
        except ValueError as exc:
            raise ValueError(f"--crl: {path}: {exc}") from None
    added: set[int] = set()
    for p in cert_paths:
        try:
            cert = x509.load_pem_x509_certificate(p.read_bytes())
        except ValueError:
            raise ValueError(f"--cert: {p} is not a PEM certificate") from None
        try:  # the CA's signature, not just its name: two CAs may share a name
            cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert_pem))
        except (ValueError, TypeError, InvalidSignature):
            raise ValueError(f"--cert: {p} was not issued by the CA in {dir_}") from None
        added.add(cert.serial_number)
    for s in serials:
        try:
            added.add(int(s, 16))
        except ValueError:
            raise ValueError(f"--serial: {s!r} is not a hexadecimal serial number") from None
    pem = pki.create_crl(ca, kept | added, valid_days=days)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")  # replaced whole: daemons re-read the file when it changes
    tmp.write_bytes(pem)
    os.replace(tmp, path)
    crl = x509.load_pem_x509_crl(pem)
    info = {"crl": str(path), "revoked": sorted(f"{s:x}" for s in kept | added),
            "added": sorted(f"{s:x}" for s in added - kept), "next_update": crl.next_update_utc.isoformat()}
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        click.echo(f"{path}: {len(info['revoked'])} revoked ({len(info['added'])} new), valid until "
                   f"{info['next_update']}")
