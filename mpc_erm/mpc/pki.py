"""A small PKI for mpc_erm: one CA per deployment, one key + certificate per identity.

Why: every gRPC channel between parties, the dealer and the coordinator is mutual TLS, and
authorisation decisions ("is this caller party p2?") are taken on the identity bound into the
peer's certificate. So the certificate must carry the identity unambiguously:

* subject CN = the identity name (for humans and `openssl x509 -text`);
* SAN URI ``mpc-erm://<role>/<name>`` — the authoritative identity, parsed by
  :func:`identity_of_certificate` and by the server-side Authorizer;
* SAN DNS ``<label>.<role>.mpc-erm.invalid`` and ``<label>.id.mpc-erm.invalid`` — synthetic host
  names so a *client* can pin the identity of the server it dials with gRPC's own TLS host-name
  check (see :mod:`mpc_erm.mpc.tls`). ``.invalid`` is reserved (RFC 2606) and never resolves.
  DNS matching is case-insensitive, so names that are not plain lower-case DNS labels are
  base32-encoded: ``P1`` and ``p1`` get different host names;
* SAN DNS/IP for ``hosts`` so the same certificate serves the identity's listener to ordinary
  TLS clients (grpcurl, health checkers).

Keys are EC P-256 (ECDSA/SHA-256): accepted by BoringSSL (gRPC), OpenSSL and every TLS 1.2/1.3
stack, unlike Ed25519 certificates which several TLS stacks still refuse. Private keys are stored
unencrypted (PKCS#8 PEM) with mode 0600: daemons must start unattended; protect the directory.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import logging
import os
import re
import secrets
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple, get_args

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# the spelling of identity names lives below the PKI (the job file checks names without it); the
# PKI's own names for it stay importable from here
from ..identity_names import RESERVED_NAMES as RESERVED_NAMES
from ..identity_names import validate_name

log = logging.getLogger(__name__)

Role = Literal["party", "dealer", "coordinator", "owner"]  # owner: one of a job's many data owners
ROLES: tuple[str, ...] = get_args(Role)

URI_SCHEME = "mpc-erm"
ID_DOMAIN = "mpc-erm.invalid"
"""Synthetic DNS zone for identity host names; ``.invalid`` never resolves (RFC 2606)."""
ANY_ROLE_LABEL = "id"
"""``<label>.id.mpc-erm.invalid`` names the identity regardless of role."""

CA_CERT_FILE = "ca.crt"
CA_KEY_FILE = "ca.key"
DEFAULT_HOSTS: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")

_PLAIN_LABEL_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_HOST_LABEL_RE = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_CLOCK_SKEW = dt.timedelta(minutes=5)


@dataclass(frozen=True)
class CertificateAuthority:
    """The deployment's CA. ``key_pem`` is secret: never log or print it."""

    cert_pem: bytes
    key_pem: bytes
    name: str

    def __repr__(self) -> str:  # keep the key out of tracebacks and logs
        return f"CertificateAuthority(name={self.name!r}, fingerprint={fingerprint(self.cert_pem)!r})"


@dataclass(frozen=True)
class Identity:
    """One party/dealer/coordinator: its certificate, private key and the CA that signed it."""

    name: str
    role: Role
    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes

    def __repr__(self) -> str:  # keep the key out of tracebacks and logs
        return f"Identity(role={self.role!r}, name={self.name!r}, fingerprint={fingerprint(self.cert_pem)!r})"

    @property
    def uri(self) -> str:
        return identity_uri(self.role, self.name)


class IdentityFiles(NamedTuple):
    cert: Path
    key: Path
    ca: Path


# --------------------------------------------------------------------------- validation / naming


def validate_role(role: object, field: str = "role") -> Role:
    if role not in ROLES:
        raise ValueError(f"{field}: must be one of {', '.join(ROLES)}, got {role!r}")
    return role  # type: ignore[return-value]


def identity_uri(role: Role, name: str) -> str:
    return f"{URI_SCHEME}://{role}/{name}"


def _name_label(name: str) -> str:
    """Case-preserving DNS form of a name: DNS matching ignores case, identity names do not."""
    if _PLAIN_LABEL_RE.fullmatch(name):
        return name
    encoded = base64.b32encode(name.encode()).decode().rstrip("=").lower()
    chunks = [encoded[i : i + 63] for i in range(0, len(encoded), 63)]
    # The trailing "b32" label keeps encoded names disjoint from plain one-label names.
    return ".".join([*chunks, "b32"])


def identity_hostname(name: str, role: Role | None = None) -> str:
    """Synthetic SAN DNS name that pins ``name`` (and ``role`` if given) in TLS host-name checks."""
    validate_name(name)
    tag = ANY_ROLE_LABEL if role is None else validate_role(role)
    return f"{_name_label(name)}.{tag}.{ID_DOMAIN}"


def _validate_hosts(hosts: Iterable[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for host in hosts:
        if not isinstance(host, str) or not host:
            raise ValueError(f"hosts: entries must be non-empty strings, got {host!r}")
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(host)))
            continue
        except ValueError:
            pass
        h = host.rstrip(".").lower()
        if h == ID_DOMAIN or h.endswith("." + ID_DOMAIN):
            # Only issue_identity may mint names in the identity zone, or a party could pin as another.
            raise ValueError(f"hosts: {host!r} is in the reserved identity zone .{ID_DOMAIN}")
        labels = h.split(".")
        if len(h) > 253 or not all(_HOST_LABEL_RE.fullmatch(label) for label in labels):
            raise ValueError(f"hosts: {host!r} is neither an IP address nor a valid DNS name (no wildcards)")
        out.append(x509.DNSName(h))
    return out


# --------------------------------------------------------------------------- helpers


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _load_cert(pem: bytes, what: str) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise ValueError(f"{what}: not a PEM X.509 certificate") from exc


def _load_key(pem: bytes, what: str) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:  # no key material in the message
        raise ValueError(f"{what}: not an unencrypted PEM private key") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{what}: expected an EC private key, got {type(key).__name__}")
    return key


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def fingerprint(cert_pem: bytes) -> str:
    """SHA-256 fingerprint, colon-separated hex (the form `openssl x509 -fingerprint` prints)."""
    digest = _load_cert(cert_pem, "certificate").fingerprint(hashes.SHA256())
    return ":".join(f"{b:02X}" for b in digest)


def certificate_serial(cert_pem: bytes) -> int:
    return _load_cert(cert_pem, "certificate").serial_number


def _common_name(cert: x509.Certificate) -> str | None:
    attrs = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(attrs[0].value) if attrs else None


# --------------------------------------------------------------------------- CA and issuance


def create_ca(name: str = "mpc-erm CA", valid_days: int = 365) -> CertificateAuthority:
    """Self-signed CA allowed to sign leaf certificates only (pathlen 0: no sub-CAs)."""
    if not isinstance(name, str) or not (1 <= len(name) <= 64) or not name.isprintable():
        raise ValueError(f"name: CA name must be 1-64 printable characters, got {name!r}")
    if not isinstance(valid_days, int) or valid_days < 1:
        raise ValueError(f"valid_days: must be an integer >= 1, got {valid_days!r}")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _utcnow()
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertificateAuthority(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key), name)


def _sign_leaf(
    ca: CertificateAuthority,
    public_key: ec.EllipticCurvePublicKey,
    name: str,
    role: Role,
    valid_days: int,
    hosts: Sequence[str],
    not_before: dt.datetime | None,
    not_after: dt.datetime | None,
) -> bytes:
    """The one place leaf certificates are made, so direct issuance and CSR signing cannot drift."""
    validate_name(name)
    validate_role(role)
    if isinstance(hosts, str):  # a bare string would be split into characters
        hosts = (hosts,)
    host_names = _validate_hosts(hosts)
    if not isinstance(valid_days, int) or valid_days < 1:
        raise ValueError(f"valid_days: must be an integer >= 1, got {valid_days!r}")
    ca_cert = _load_cert(ca.cert_pem, "ca.cert_pem")
    ca_key = _load_key(ca.key_pem, "ca.key_pem")
    if ca_cert.public_key() != ca_key.public_key():
        raise ValueError("ca: the CA key does not match the CA certificate")

    now = _utcnow()
    start = not_before if not_before is not None else now - _CLOCK_SKEW
    end = not_after if not_after is not None else min(now + dt.timedelta(days=valid_days), ca_cert.not_valid_after_utc)
    if end <= start:
        raise ValueError("not_after: must be later than not_before")

    sans: list[x509.GeneralName] = [
        x509.UniformResourceIdentifier(identity_uri(role, name)),
        x509.DNSName(identity_hostname(name, role)),
        x509.DNSName(identity_hostname(name)),
        *host_names,
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def issue_identity(
    ca: CertificateAuthority,
    name: str,
    role: Role,
    valid_days: int = 365,
    hosts: Sequence[str] = DEFAULT_HOSTS,
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
) -> Identity:
    """New key + certificate binding ``(role, name)``; usable as both TLS client and server cert.

    ``not_before``/``not_after`` override the validity window (tests use them for expired and
    not-yet-valid certificates). Without them the certificate never outlives the CA.
    The CA holder sees the new private key: fine for one organisation or a demo; across
    organisations use :func:`create_csr` + :func:`sign_csr` so keys never leave their owner.
    """
    validate_name(name)
    validate_role(role)
    key = ec.generate_private_key(ec.SECP256R1())
    cert_pem = _sign_leaf(ca, key.public_key(), name, role, valid_days, hosts, not_before, not_after)
    return Identity(name=name, role=role, cert_pem=cert_pem, key_pem=_key_pem(key), ca_pem=ca.cert_pem)


def create_csr(name: str, role: Role) -> tuple[bytes, bytes]:
    """(csr_pem, key_pem): a new key and a signing request claiming ``(role, name)``.

    Why: each organisation generates its key on its own machine and sends only the CSR to the
    CA operator, so no one else ever holds a party's private key.
    """
    validate_name(name)
    validate_role(role)
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(identity_uri(role, name))]), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def identity_of_csr(csr_pem: bytes) -> tuple[Role, str]:
    """(role, name) a CSR claims, after checking its self-signature (proof of key possession)."""
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as exc:
        raise ValueError("csr: not a PEM certificate signing request") from exc
    if not csr.is_signature_valid:
        raise ValueError("csr: signature does not verify (corrupted or tampered request)")
    if not isinstance(csr.public_key(), ec.EllipticCurvePublicKey) or csr.public_key().curve.name != "secp256r1":
        raise ValueError("csr: key must be EC P-256")
    return _identity_from_extensions(csr.extensions, "csr")


def sign_csr(
    ca: CertificateAuthority,
    csr_pem: bytes,
    name: str,
    role: Role,
    valid_days: int = 365,
    hosts: Sequence[str] = DEFAULT_HOSTS,
) -> bytes:
    """Certificate (PEM) for the CSR's key, binding the ``(role, name)`` the CA operator approved.

    The operator states name and role explicitly; the CSR must claim the same, so a request for
    ``dealer/x`` cannot be signed as ``party/x`` by mistake. Only the CSR's public key is used:
    every extension comes from the CA side (no requester-chosen SANs or CA flags).
    """
    validate_name(name)
    validate_role(role)
    claimed = identity_of_csr(csr_pem)
    if claimed != (role, name):
        raise ValueError(f"csr: requests {identity_uri(*claimed)}, not {identity_uri(role, name)}")
    public_key = x509.load_pem_x509_csr(csr_pem).public_key()
    return _sign_leaf(ca, public_key, name, role, valid_days, hosts, None, None)  # type: ignore[arg-type]


def identity_of_certificate(cert_pem: bytes | x509.Certificate) -> tuple[Role, str]:
    """(role, name) from the certificate's single ``mpc-erm://<role>/<name>`` SAN URI.

    Why the URI and not the CN: the CN is free text in many tools' eyes; the URI is typed and
    exactly one is allowed, so there is no ambiguity about which identity a certificate asserts.
    """
    cert = cert_pem if isinstance(cert_pem, x509.Certificate) else _load_cert(cert_pem, "certificate")
    return _identity_from_extensions(cert.extensions, "certificate")


def _identity_from_extensions(extensions: x509.Extensions, what: str) -> tuple[Role, str]:
    """The single ``mpc-erm://<role>/<name>`` SAN URI of a certificate or CSR (``what`` names it
    in errors): one parser, so a request and the certificate signed for it are read alike."""
    try:
        san = extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound as exc:
        raise ValueError(f"{what}: no subjectAltName, so no mpc-erm identity") from exc
    prefix = f"{URI_SCHEME}://"
    uris = [u for u in san.get_values_for_type(x509.UniformResourceIdentifier) if u.startswith(prefix)]
    if len(uris) != 1:
        raise ValueError(f"{what}: expected exactly one {prefix}<role>/<name> SAN URI, found {len(uris)}")
    role, sep, name = uris[0][len(prefix) :].partition("/")
    if not sep:
        raise ValueError(f"{what}: malformed identity URI {uris[0]!r}")
    return validate_role(role, f"{what} role"), validate_name(name, f"{what} name")


# --------------------------------------------------------------------------- revocation (CRL)


def create_crl(
    ca: CertificateAuthority,
    revoked_serials: Iterable[int],
    valid_days: int = 30,
    *,
    last_update: dt.datetime | None = None,
    next_update: dt.datetime | None = None,
) -> bytes:
    """A CA-signed CRL (PEM) listing ``revoked_serials``, valid for ``valid_days``.

    Why signed: revocations travel between organisations; a party should only honour a
    revocation list it can check came from the deployment's CA. ``last_update``/``next_update``
    override the validity window (tests use them for stale lists).
    """
    ca_cert = _load_cert(ca.cert_pem, "ca.cert_pem")
    ca_key = _load_key(ca.key_pem, "ca.key_pem")
    now = _utcnow()
    start = last_update if last_update is not None else now - _CLOCK_SKEW
    end = next_update if next_update is not None else now + dt.timedelta(days=valid_days)
    if end <= start:
        raise ValueError("next_update: must be later than last_update")
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca_cert.subject)
        .last_update(start)
        .next_update(end)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    for serial in sorted(set(revoked_serials)):
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(min(now, end)).build()
        )
    return builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def revoked_serials_from_crl(crl_pem: bytes, ca_pem: bytes, *, check_validity: bool = True) -> frozenset[int]:
    """Serials listed in ``crl_pem`` after checking it is signed by the CA in ``ca_pem`` and current.

    A list past its ``next_update`` is refused (fail closed, as OpenSSL's CRL check does): a stale
    list would silently stop covering certificates revoked since; the operator must issue a fresh one.
    """
    try:
        crl = x509.load_pem_x509_crl(crl_pem)
    except ValueError as exc:
        raise ValueError("crl: not a PEM X.509 CRL") from exc
    ca_cert = _load_cert(ca_pem, "ca")
    if crl.issuer != ca_cert.subject or not crl.is_signature_valid(ca_cert.public_key()):  # type: ignore[arg-type]
        raise ValueError("crl: not signed by this CA")
    if check_validity:
        now = _utcnow()
        if crl.last_update_utc - _CLOCK_SKEW > now:
            raise ValueError(f"crl: not valid before {crl.last_update_utc.isoformat()} (issued in the future)")
        if crl.next_update_utc is not None and crl.next_update_utc < now:
            raise ValueError(f"crl: stale since {crl.next_update_utc.isoformat()} (next_update passed); "
                             "issue a fresh one")
    return frozenset(r.serial_number for r in crl)


# --------------------------------------------------------------------------- files


def _write_file(path: Path, data: bytes, mode: int) -> None:
    """Write via a temp file created with ``mode`` then rename: the key is never briefly world-readable."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # O_CREAT's mode is filtered by umask; be exact
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def _read(path: Path) -> bytes:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    return path.read_bytes()


def _warn_if_key_exposed(path: Path) -> None:
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("private key %s is accessible by group/others (mode %o); chmod 600 it", path, mode & 0o777)


def save_ca(ca: CertificateAuthority, dir: str | os.PathLike[str]) -> IdentityFiles:
    """Write ``ca.crt`` (0644) and ``ca.key`` (0600) into ``dir`` (created 0700 if missing)."""
    d = Path(dir)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    cert_path, key_path = d / CA_CERT_FILE, d / CA_KEY_FILE
    _write_file(key_path, ca.key_pem, 0o600)
    _write_file(cert_path, ca.cert_pem, 0o644)
    return IdentityFiles(cert=cert_path, key=key_path, ca=cert_path)


def load_ca(dir: str | os.PathLike[str]) -> CertificateAuthority:
    """Read and check ``ca.crt``/``ca.key``: the key must match and the cert must be a CA."""
    d = Path(dir)
    cert_path, key_path = d / CA_CERT_FILE, d / CA_KEY_FILE
    cert_pem, key_pem = _read(cert_path), _read(key_path)
    cert = _load_cert(cert_pem, str(cert_path))
    key = _load_key(key_pem, str(key_path))
    _warn_if_key_exposed(key_path)
    if cert.public_key() != key.public_key():
        raise ValueError(f"{key_path}: private key does not match {cert_path}")
    try:
        bc = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        bc = None
    if bc is None or not bc.ca:
        raise ValueError(f"{cert_path}: not a CA certificate (basicConstraints CA:TRUE missing)")
    return CertificateAuthority(cert_pem=cert_pem, key_pem=key_pem, name=_common_name(cert) or "")


def identity_files(dir: str | os.PathLike[str], name: str) -> IdentityFiles:
    d = Path(dir)
    validate_name(name)
    return IdentityFiles(cert=d / f"{name}.crt", key=d / f"{name}.key", ca=d / CA_CERT_FILE)


def _save_ca_copy(path: Path, ca_pem: bytes) -> None:
    if path.exists():
        if path.read_bytes().strip() != ca_pem.strip():
            raise ValueError(f"{path}: holds a different CA certificate than the identity's; use another dir")
    else:
        _write_file(path, ca_pem, 0o644)


def save_identity(identity: Identity, dir: str | os.PathLike[str]) -> IdentityFiles:
    """Write ``<name>.crt``, ``<name>.key`` (0600) and ``ca.crt``; refuse to replace a different ca.crt."""
    paths = identity_files(dir, identity.name)
    paths.cert.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    _save_ca_copy(paths.ca, identity.ca_pem)
    _write_file(paths.key, identity.key_pem, 0o600)
    _write_file(paths.cert, identity.cert_pem, 0o644)
    return paths


def save_request(dir: str | os.PathLike[str], name: str, csr_pem: bytes, key_pem: bytes) -> tuple[Path, Path]:
    """Write ``<name>.csr`` and ``<name>.key`` (0600); returns (csr path, key path)."""
    paths = identity_files(dir, name)
    paths.key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    csr_path = paths.key.with_suffix(".csr")
    _write_file(paths.key, key_pem, 0o600)
    _write_file(csr_path, csr_pem, 0o644)
    return csr_path, paths.key


def save_certificate(dir: str | os.PathLike[str], name: str, cert_pem: bytes, ca_pem: bytes) -> IdentityFiles:
    """Write a signed ``<name>.crt`` and ``ca.crt`` next to (or for) the requester's key."""
    paths = identity_files(dir, name)
    paths.cert.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    _save_ca_copy(paths.ca, ca_pem)
    _write_file(paths.cert, cert_pem, 0o644)
    return paths


def _check_validity(cert: x509.Certificate, label: str) -> None:
    now = _utcnow()
    if now < cert.not_valid_before_utc:
        raise ValueError(f"{label}: certificate is not valid before {cert.not_valid_before_utc.isoformat()}")
    if now > cert.not_valid_after_utc:
        raise ValueError(f"{label}: certificate expired at {cert.not_valid_after_utc.isoformat()}")


def _check_issued_by(cert: x509.Certificate, ca_cert: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def verify_identity(identity: Identity, *, check_validity: bool = True) -> None:
    """Raise ValueError unless key matches cert, cert is signed by the CA, and it names ``identity``."""
    label = f"identity {identity.name!r}"
    cert = _load_cert(identity.cert_pem, f"{label} certificate")
    ca_cert = _load_cert(identity.ca_pem, f"{label} CA certificate")
    key = _load_key(identity.key_pem, f"{label} key")
    if cert.public_key() != key.public_key():
        raise ValueError(f"{label}: private key does not match the certificate")
    if not _check_issued_by(cert, ca_cert):
        raise ValueError(f"{label}: certificate is not issued by the CA certificate")
    role, name = identity_of_certificate(cert)
    if (role, name) != (identity.role, identity.name):
        raise ValueError(f"{label}: certificate names {identity_uri(role, name)}, not {identity.uri}")
    if check_validity:
        _check_validity(cert, label)


def load_identity(dir: str | os.PathLike[str], name: str, *, check_validity: bool = True) -> Identity:
    """Load ``<name>.crt``/``<name>.key``/``ca.crt`` and check they form a usable identity.

    Why check here: a mismatched key or a cert from another CA otherwise surfaces only as an
    opaque TLS handshake failure on some other organisation's machine.
    """
    paths = identity_files(dir, name)
    cert_pem, key_pem, ca_pem = _read(paths.cert), _read(paths.key), _read(paths.ca)
    cert = _load_cert(cert_pem, str(paths.cert))
    ca_cert = _load_cert(ca_pem, str(paths.ca))
    key = _load_key(key_pem, str(paths.key))
    _warn_if_key_exposed(paths.key)
    if cert.public_key() != key.public_key():
        raise ValueError(f"{paths.key}: private key does not match {paths.cert}")
    if not _check_issued_by(cert, ca_cert):
        raise ValueError(f"{paths.cert}: not issued by the CA in {paths.ca}")
    try:
        role, cert_name = identity_of_certificate(cert)
    except ValueError as exc:
        raise ValueError(f"{paths.cert}: {exc}") from exc
    if cert_name != name:
        raise ValueError(f"{paths.cert}: certificate is for {cert_name!r}, not {name!r}")
    if check_validity:
        _check_validity(cert, str(paths.cert))
    return Identity(name=name, role=role, cert_pem=cert_pem, key_pem=key_pem, ca_pem=ca_pem)
