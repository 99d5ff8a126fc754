"""PKI: certificate contents, naming rules, file layout and permissions, load-time checks, CLI."""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from hypothesis import given, settings
from hypothesis import strategies as st

from mpc_erm.mpc import pki
from mpc_erm.mpc.callers import RevocationList
from tests.cli_main import run_main

REPO = Path(__file__).resolve().parents[2]
UTC = dt.timezone.utc


@pytest.fixture(scope="module")
def ca() -> pki.CertificateAuthority:
    return pki.create_ca("test CA", valid_days=30)


@pytest.fixture(scope="module")
def other_ca() -> pki.CertificateAuthority:
    return pki.create_ca("other CA", valid_days=30)


def _cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


# --------------------------------------------------------------------------- certificate contents


def test_ca_is_p256_ca_with_pathlen_0(ca: pki.CertificateAuthority) -> None:
    cert = _cert(ca.cert_pem)
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert cert.public_key().curve.name == "secp256r1"
    bc = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca and bc.value.path_length == 0
    ku = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.key_cert_sign and ku.crl_sign and not ku.digital_signature
    assert ca.name == "test CA"


def test_identity_certificate_binds_role_and_name(ca: pki.CertificateAuthority) -> None:
    ident = pki.issue_identity(ca, "p1", "party", hosts=("localhost", "10.0.0.7", "p1.example.org"))
    cert = _cert(ident.cert_pem)
    assert cert.subject.rfc4514_string() == "CN=p1"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["mpc-erm://party/p1"]
    dns = san.get_values_for_type(x509.DNSName)
    assert {"p1.party.mpc-erm.invalid", "p1.id.mpc-erm.invalid", "localhost", "p1.example.org"} == set(dns)
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    cert.verify_directly_issued_by(_cert(ca.cert_pem))
    assert pki.identity_of_certificate(ident.cert_pem) == ("party", "p1")
    assert ident.uri == "mpc-erm://party/p1" and ident.ca_pem == ca.cert_pem
    pki.verify_identity(ident)


def test_identity_never_outlives_its_ca(ca: pki.CertificateAuthority) -> None:
    ident = pki.issue_identity(ca, "long", "dealer", valid_days=10_000)
    assert _cert(ident.cert_pem).not_valid_after_utc <= _cert(ca.cert_pem).not_valid_after_utc


def test_explicit_validity_window(ca: pki.CertificateAuthority) -> None:
    start = dt.datetime(2020, 1, 1, tzinfo=UTC)
    end = dt.datetime(2020, 1, 2, tzinfo=UTC)
    ident = pki.issue_identity(ca, "old", "party", not_before=start, not_after=end)
    cert = _cert(ident.cert_pem)
    assert (cert.not_valid_before_utc, cert.not_valid_after_utc) == (start, end)
    with pytest.raises(ValueError, match="expired"):
        pki.verify_identity(ident)
    pki.verify_identity(ident, check_validity=False)
    with pytest.raises(ValueError, match="not_after"):
        pki.issue_identity(ca, "x", "party", not_before=end, not_after=start)


def test_repr_hides_private_keys(ca: pki.CertificateAuthority) -> None:
    ident = pki.issue_identity(ca, "p1", "party")
    for obj in (ca, ident):
        assert "PRIVATE KEY" not in repr(obj) and "PRIVATE KEY" not in str(obj)
    assert "p1" in repr(ident)


# --------------------------------------------------------------------------- naming rules


@pytest.mark.parametrize("name", ["p1", "P1", "org-a.party_1", "a" * 64, "0", "x.", "a..b"])
def test_valid_names(ca: pki.CertificateAuthority, name: str) -> None:
    assert pki.identity_of_certificate(pki.issue_identity(ca, name, "party").cert_pem) == ("party", name)


@pytest.mark.parametrize("name", ["", "a" * 65, ".hidden", "a/b", "a b", "é", "p1\n", "../x", "ca", "CA", 7])
def test_invalid_names_name_the_field(ca: pki.CertificateAuthority, name: object) -> None:
    with pytest.raises(ValueError, match=r"^name: "):
        pki.issue_identity(ca, name, "party")  # type: ignore[arg-type]


def test_invalid_role(ca: pki.CertificateAuthority) -> None:
    with pytest.raises(ValueError, match=r"^role: "):
        pki.issue_identity(ca, "p1", "admin")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "host", ["*.example.org", "p2.party.mpc-erm.invalid", "MPC-ERM.invalid", "bad host", "a..b", "", "-x.org"]
)
def test_invalid_hosts_rejected(ca: pki.CertificateAuthority, host: str) -> None:
    # Wildcards or names in the identity zone would let one identity pass another's pinning check.
    with pytest.raises(ValueError, match=r"^hosts: "):
        pki.issue_identity(ca, "p1", "party", hosts=(host,))


def test_bad_valid_days(ca: pki.CertificateAuthority) -> None:
    with pytest.raises(ValueError, match=r"^valid_days: "):
        pki.issue_identity(ca, "p1", "party", valid_days=0)
    with pytest.raises(ValueError, match=r"^valid_days: "):
        pki.create_ca(valid_days=0)


def test_hostnames_distinguish_case_and_role() -> None:
    names = {pki.identity_hostname(n, r).lower() for n in ("p1", "P1", "p1.", "P1.") for r in (None, "party", "dealer")}
    assert len(names) == 12
    assert pki.identity_hostname("p1", "party") == "p1.party.mpc-erm.invalid"
    assert all(len(label) <= 63 for label in pki.identity_hostname("A" * 64).split("."))


_names = st.text(alphabet="abcAB01.-_", min_size=1, max_size=64).filter(
    lambda s: not s.startswith(".") and s.lower() != "ca"
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_names, min_size=2, max_size=2, unique=True))
def test_identity_hostname_injective_ignoring_case(pair: list[str]) -> None:
    # TLS host-name matching ignores case; identity names do not. Distinct names must never collide.
    a, b = pair
    assert pki.identity_hostname(a).lower() != pki.identity_hostname(b).lower()


def test_identity_of_certificate_requires_uri(ca: pki.CertificateAuthority) -> None:
    with pytest.raises(ValueError, match="subjectAltName"):
        pki.identity_of_certificate(ca.cert_pem)
    with pytest.raises(ValueError, match="certificate"):
        pki.identity_of_certificate(b"not a cert")


# --------------------------------------------------------------------------- files


def test_ca_round_trip_and_permissions(tmp_path: Path, ca: pki.CertificateAuthority) -> None:
    old = os.umask(0)  # even with a permissive umask, keys must come out 0600
    try:
        paths = pki.save_ca(ca, tmp_path / "certs")
    finally:
        os.umask(old)
    assert stat.S_IMODE(paths.key.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "certs").stat().st_mode) == 0o700
    loaded = pki.load_ca(tmp_path / "certs")
    assert loaded == ca


def test_identity_round_trip_and_permissions(tmp_path: Path, ca: pki.CertificateAuthority) -> None:
    ident = pki.issue_identity(ca, "dealer-1", "dealer")
    old = os.umask(0)
    try:
        paths = pki.save_identity(ident, tmp_path)
    finally:
        os.umask(old)
    assert paths == (tmp_path / "dealer-1.crt", tmp_path / "dealer-1.key", tmp_path / "ca.crt")
    assert stat.S_IMODE(paths.key.stat().st_mode) == 0o600
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left
    assert pki.load_identity(tmp_path, "dealer-1") == ident


def test_key_cert_mismatch_names_the_key_file(tmp_path: Path, ca: pki.CertificateAuthority) -> None:
    pki.save_identity(pki.issue_identity(ca, "p1", "party"), tmp_path)
    pki.save_identity(pki.issue_identity(ca, "p2", "party"), tmp_path)
    (tmp_path / "p1.key").write_bytes((tmp_path / "p2.key").read_bytes())
    with pytest.raises(ValueError, match=r"p1\.key: private key does not match") as err:
        pki.load_identity(tmp_path, "p1")
    assert "PRIVATE" not in str(err.value)


def test_cert_from_another_ca_names_the_cert_file(
    tmp_path: Path, ca: pki.CertificateAuthority, other_ca: pki.CertificateAuthority
) -> None:
    pki.save_ca(ca, tmp_path)
    foreign = pki.issue_identity(other_ca, "p1", "party")
    (tmp_path / "p1.crt").write_bytes(foreign.cert_pem)
    (tmp_path / "p1.key").write_bytes(foreign.key_pem)
    with pytest.raises(ValueError, match=r"p1\.crt: not issued by the CA"):
        pki.load_identity(tmp_path, "p1")


def test_save_identity_refuses_a_different_ca(
    tmp_path: Path, ca: pki.CertificateAuthority, other_ca: pki.CertificateAuthority
) -> None:
    pki.save_ca(ca, tmp_path)
    with pytest.raises(ValueError, match=r"ca\.crt: holds a different CA"):
        pki.save_identity(pki.issue_identity(other_ca, "p1", "party"), tmp_path)


def test_load_errors_name_the_file(tmp_path: Path, ca: pki.CertificateAuthority) -> None:
    with pytest.raises(FileNotFoundError, match=r"p9\.crt"):
        pki.load_identity(tmp_path, "p9")
    with pytest.raises(FileNotFoundError, match=r"ca\.crt"):
        pki.load_ca(tmp_path)
    pki.save_identity(pki.issue_identity(ca, "p1", "party"), tmp_path)
    (tmp_path / "p1.crt").rename(tmp_path / "p2.crt")
    (tmp_path / "p1.key").rename(tmp_path / "p2.key")
    with pytest.raises(ValueError, match=r"p2\.crt: certificate is for 'p1'"):
        pki.load_identity(tmp_path, "p2")
    (tmp_path / "p2.key").write_text("garbage")
    with pytest.raises(ValueError, match=r"p2\.key: not an unencrypted PEM private key"):
        pki.load_identity(tmp_path, "p2")


def test_load_ca_detects_mismatch_and_non_ca(tmp_path: Path, ca: pki.CertificateAuthority) -> None:
    other = pki.create_ca()
    pki.save_ca(ca, tmp_path)
    (tmp_path / "ca.key").write_bytes(other.key_pem)
    with pytest.raises(ValueError, match=r"ca\.key: private key does not match"):
        pki.load_ca(tmp_path)
    leaf = pki.issue_identity(ca, "p1", "party")
    (tmp_path / "ca.crt").write_bytes(leaf.cert_pem)
    (tmp_path / "ca.key").write_bytes(leaf.key_pem)
    with pytest.raises(ValueError, match="not a CA certificate"):
        pki.load_ca(tmp_path)


def test_load_identity_checks_validity(tmp_path: Path, ca: pki.CertificateAuthority) -> None:
    future = dt.datetime.now(UTC) + dt.timedelta(days=1)
    ident = pki.issue_identity(ca, "p1", "party", not_before=future, not_after=future + dt.timedelta(days=1))
    pki.save_identity(ident, tmp_path)
    with pytest.raises(ValueError, match=r"p1\.crt: certificate is not valid before"):
        pki.load_identity(tmp_path, "p1")
    assert pki.load_identity(tmp_path, "p1", check_validity=False) == ident


def test_crl_round_trip_and_signature_check(ca: pki.CertificateAuthority, other_ca: pki.CertificateAuthority) -> None:
    serial = pki.certificate_serial(pki.issue_identity(ca, "p1", "party").cert_pem)
    crl = pki.create_crl(ca, [serial, 5])
    assert pki.revoked_serials_from_crl(crl, ca.cert_pem) == {serial, 5}
    with pytest.raises(ValueError, match="crl: not signed by this CA"):
        pki.revoked_serials_from_crl(pki.create_crl(other_ca, [serial]), ca.cert_pem)


# --------------------------------------------------------------------------- CSR flow


def test_csr_flow_keeps_key_with_requester(tmp_path: Path, ca: pki.CertificateAuthority) -> None:
    csr_pem, key_pem = pki.create_csr("org-b", "party")
    assert pki.identity_of_csr(csr_pem) == ("party", "org-b")
    cert_pem = pki.sign_csr(ca, csr_pem, "org-b", "party", hosts=("b.example.org",))
    pki.save_request(tmp_path, "org-b", csr_pem, key_pem)
    pki.save_certificate(tmp_path, "org-b", cert_pem, ca.cert_pem)
    assert stat.S_IMODE((tmp_path / "org-b.key").stat().st_mode) == 0o600
    ident = pki.load_identity(tmp_path, "org-b")
    assert ident.key_pem == key_pem and pki.identity_of_certificate(cert_pem) == ("party", "org-b")
    san = _cert(cert_pem).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "b.example.org" in san.get_values_for_type(x509.DNSName)


def test_sign_csr_refuses_mismatch_and_tampering(ca: pki.CertificateAuthority) -> None:
    csr_pem, _key = pki.create_csr("d", "dealer")
    with pytest.raises(ValueError, match="csr: requests mpc-erm://dealer/d, not mpc-erm://party/d"):
        pki.sign_csr(ca, csr_pem, "d", "party")
    with pytest.raises(ValueError, match="csr: requests"):
        pki.sign_csr(ca, csr_pem, "e", "dealer")
    other_csr, _ = pki.create_csr("e", "dealer")
    # Splice another request's public key into this one: the self-signature no longer verifies.
    from cryptography.hazmat.primitives import serialization

    der = bytearray(x509.load_pem_x509_csr(csr_pem).public_bytes(serialization.Encoding.DER))
    pub = x509.load_pem_x509_csr(csr_pem).public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    other_pub = x509.load_pem_x509_csr(other_csr).public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    i = bytes(der).index(pub)
    der[i : i + len(pub)] = other_pub
    tampered = x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM)
    with pytest.raises(ValueError, match="csr: signature does not verify"):
        pki.sign_csr(ca, tampered, "d", "dealer")
    with pytest.raises(ValueError, match="csr: not a PEM"):
        pki.sign_csr(ca, b"junk", "d", "dealer")


# --------------------------------------------------------------------------- CLI (real subprocess)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coordinator.cli", "certs", *args],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )


def test_cli_init_and_issue(tmp_path: Path) -> None:
    # Two real interpreter starts (~5 s each while `coordinator.cli` imports torch); the
    # refusals below go through the same main() in-process.
    d = tmp_path / "certs"
    r = _cli("init", "--dir", str(d), "--name", "Test CA", "--days", "10")
    assert r.returncode == 0, r.stderr
    ca_before = (d / "ca.crt").read_bytes()
    assert stat.S_IMODE((d / "ca.key").stat().st_mode) == 0o600

    r = _cli("issue", "--dir", str(d), "--name", "p1", "--role", "party", "--host", "p1.example.org", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["identity"] == "mpc-erm://party/p1"
    assert info["cert"]["path"] == str(d / "p1.crt") and info["key"] == str(d / "p1.key")
    assert info["cert"]["sha256_fingerprint"] == pki.fingerprint((d / "p1.crt").read_bytes())
    ident = pki.load_identity(d, "p1")
    assert ident.role == "party" and ident.ca_pem == ca_before
    assert stat.S_IMODE((d / "p1.key").stat().st_mode) == 0o600


def _run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`mpc-erm certs ARGS` in process (tests.cli_main)."""
    return run_main(monkeypatch, capsys, "certs", *args)


def test_cli_errors_are_one_line_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    d = str(tmp_path)
    assert _run_main(monkeypatch, capsys, "issue", "--dir", d, "--name", "p1", "--role", "party")[0] == 2  # no CA
    assert _run_main(monkeypatch, capsys, "init", "--dir", d, "--json")[0] == 0
    cases = {
        ("--name", "a/b"): "--name:",
        ("--name", "p1", "--host", "*.evil.org"): "--host:",
        ("--name", "p1", "--host", "x.party.mpc-erm.invalid"): "--host:",
        ("--name", "p1", "--days", "0"): "--days:",
    }
    for extra, field in cases.items():
        code, _out, err = _run_main(monkeypatch, capsys, "issue", "--dir", d, "--role", "party", *extra)
        assert code == 2, (extra, err)
        assert err.startswith(f"error: {field}") and err.strip().count("\n") == 0, err
        assert not (tmp_path / "p1.key").exists()


def test_cli_refuses_overwrite_without_force(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    d = str(tmp_path)
    assert _run_main(monkeypatch, capsys, "init", "--dir", d)[0] == 0
    ca_before = (tmp_path / "ca.crt").read_bytes()
    code, _out, err = _run_main(monkeypatch, capsys, "init", "--dir", d)
    assert code == 2 and err.startswith("error: --dir:") and "--force" in err and err.strip().count("\n") == 0
    assert (tmp_path / "ca.crt").read_bytes() == ca_before
    args = ("issue", "--dir", d, "--name", "dealer", "--role", "dealer")
    assert _run_main(monkeypatch, capsys, *args)[0] == 0
    first = (tmp_path / "dealer.key").read_bytes()
    code, _out, err = _run_main(monkeypatch, capsys, *args)
    assert code == 2 and "--name" in err and "--force" in err
    assert (tmp_path / "dealer.key").read_bytes() == first
    code, out, _err = _run_main(monkeypatch, capsys, *args, "--force")
    assert code == 0 and "mpc-erm://dealer/dealer" in out
    assert (tmp_path / "dealer.key").read_bytes() != first
    assert pki.load_identity(tmp_path, "dealer").role == "dealer"
    code, _out, _err = _run_main(monkeypatch, capsys, "init", "--dir", d, "--force")
    assert code == 0
    with pytest.raises(ValueError, match="not issued by the CA"):  # the old identity died with the old CA
        pki.load_identity(tmp_path, "dealer")


def test_cli_request_and_sign(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    ca_dir, org = tmp_path / "ca", tmp_path / "org-b"
    assert _run_main(monkeypatch, capsys, "init", "--dir", str(ca_dir))[0] == 0
    code, out, err = _run_main(monkeypatch, capsys, "request", "--dir", str(org), "--name", "b", "--role", "party",
                               "--json")
    assert code == 0, err
    csr = Path(json.loads(out)["csr"])
    code, _out, err = _run_main(monkeypatch, capsys, "sign", "--dir", str(ca_dir), "--csr", str(csr),
                                "--name", "b", "--role", "dealer")
    assert code == 2 and err.startswith("error: --csr: requests mpc-erm://party/b"), err
    code, out, err = _run_main(monkeypatch, capsys, "sign", "--dir", str(ca_dir), "--csr", str(csr),
                               "--name", "b", "--role", "party", "--host", "b.example.org", "--json")
    assert code == 0, err
    assert json.loads(out)["cert"]["path"] == str(org / "b.crt")
    assert not (ca_dir / "b.key").exists()  # the CA side never had the key
    assert pki.load_identity(org, "b").role == "party"
    code, _out, err = _run_main(monkeypatch, capsys, "request", "--dir", str(org), "--name", "b", "--role", "party")
    assert code == 2 and "--force" in err


def test_cli_revoke_accumulates_serials_and_daemons_read_the_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "certs"
    assert _run_main(monkeypatch, capsys, "init", "--dir", str(d))[0] == 0
    for name in ("p1", "p2"):
        assert _run_main(monkeypatch, capsys, "issue", "--dir", str(d), "--name", name, "--role", "party")[0] == 0
    code, out, err = _run_main(monkeypatch, capsys, "revoke", "--dir", str(d), "--cert", str(d / "p1.crt"), "--json")
    assert code == 0, err
    p1 = x509.load_pem_x509_certificate((d / "p1.crt").read_bytes()).serial_number
    p2 = x509.load_pem_x509_certificate((d / "p2.crt").read_bytes()).serial_number
    assert json.loads(out)["added"] == [f"{p1:x}"]
    code, out, err = _run_main(monkeypatch, capsys, "revoke", "--dir", str(d), "--serial", f"{p2:x}", "--json")
    assert code == 0, err
    assert sorted(json.loads(out)["revoked"]) == sorted([f"{p1:x}", f"{p2:x}"])  # the first one is kept
    ca_pem = (d / "ca.crt").read_bytes()
    assert RevocationList(d / "crl.pem", ca_pem).serials() == {p1, p2}  # what a daemon loads
    other = tmp_path / "other"
    assert _run_main(monkeypatch, capsys, "init", "--dir", str(other))[0] == 0
    code, _, err = _run_main(monkeypatch, capsys, "revoke", "--dir", str(other), "--cert", str(d / "p1.crt"))
    assert code != 0 and "--cert" in err and "not issued by the CA" in err
    code, _, err = _run_main(monkeypatch, capsys, "revoke", "--dir", str(d), "--serial", "xyz")
    assert code != 0 and "--serial" in err
