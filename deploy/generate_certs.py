"""Create a CA, the SuperLink's TLS certificate and SuperNode authentication key pairs (no openssl needed).

    python deploy/generate_certs.py --out deploy/certs --host superlink.example.org --ip 192.168.1.10 \
        --nodes pi-0,jetson-0,phone-0

Writes OUT/ca.crt, OUT/ca.key, OUT/server.pem, OUT/server.key (for flower-superlink --ssl-*), and per node
OUT/nodes/NAME (ECDSA P-384 private key, OpenSSH format) and OUT/nodes/NAME.pub (OpenSSH public key, for
`flwr supernode register`). Existing files are kept unless --force; private keys are written 0600 and the
folders 0700, whatever the umask or files left by an interrupted run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

VALID_DAYS = 825


def _private_dir(path: Path) -> None:
    """Create `path` (and parents) and make it 0700 whatever the umask or an earlier run left."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def _write(path: Path, data: bytes, private: bool, force: bool) -> None:
    if path.exists() and not force:
        print(f"kept {path} (exists; --force replaces it)")
        return
    _private_dir(path.parent)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.unlink(missing_ok=True)  # a stale temporary file would keep its own (possibly readable) mode
    mode = 0o600 if private else 0o644
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as fh:
        os.fchmod(fh.fileno(), mode)  # exact mode: os.open's mode is reduced by the umask, never raised
        fh.write(data)
    os.replace(tmp, path)
    print(f"wrote {path}")


def _pem_key(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_ca(common_name: str = "pflower CA") -> tuple[rsa.RSAPrivateKey, x509.Certificate]:
    """A self-signed CA key and certificate."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=4096)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def make_server_cert(
    ca_key, ca_cert: x509.Certificate, hosts: list[str], ips: list[str]
) -> tuple[rsa.RSAPrivateKey, x509.Certificate]:
    """The SuperLink's key and certificate, valid for the given host names and IP addresses."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=4096)
    names = [x509.DNSName(h) for h in hosts] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0] if hosts else ips[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def make_node_key() -> tuple[bytes, bytes]:
    """(private key, public key) of an ECDSA P-384 SuperNode authentication key, both in OpenSSH format
    (what `flower-supernode --auth-supernode-private-key` and `flwr supernode register` read)."""
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public + b"\n"


def main(argv: list[str] | None = None) -> None:
    """Write the CA, server certificate and node keys."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="deploy/certs", help="output folder (keep it out of git)")
    parser.add_argument("--host", action="append", default=[], help="SuperLink DNS name (repeatable)")
    parser.add_argument("--ip", action="append", default=[], help="SuperLink IP address (repeatable)")
    parser.add_argument("--nodes", default="", help="comma-separated SuperNode names")
    parser.add_argument("--force", action="store_true", help="replace existing files")
    args = parser.parse_args(argv)
    # localhost and 127.0.0.1 always: the reverse proxy and the operator reach the SuperLink on loopback
    hosts = list(dict.fromkeys([*args.host, "localhost"]))
    ips = list(dict.fromkeys([*args.ip, "127.0.0.1"]))
    try:
        for ip in ips:
            ipaddress.ip_address(ip)
    except ValueError as exc:
        sys.exit(f"error: {exc}")
    out = Path(args.out)
    ca_path, ca_key_path = out / "ca.crt", out / "ca.key"
    if ca_path.exists() and ca_key_path.exists() and not args.force:
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate(ca_path.read_bytes())
        print(f"kept {ca_path} (exists; --force replaces it)")
    else:
        ca_key, ca_cert = make_ca()
        _write(ca_key_path, _pem_key(ca_key), True, True)
        _write(ca_path, ca_cert.public_bytes(serialization.Encoding.PEM), False, True)
    if not (out / "server.pem").exists() or args.force:
        server_key, server_cert = make_server_cert(ca_key, ca_cert, hosts, ips)
        _write(out / "server.key", _pem_key(server_key), True, True)
        _write(out / "server.pem", server_cert.public_bytes(serialization.Encoding.PEM), False, True)
    for name in filter(None, (n.strip() for n in args.nodes.split(","))):
        if not name.replace("-", "").replace("_", "").isalnum():
            sys.exit(f"error: node name {name!r} may hold only letters, digits, '-' and '_'")
        private, public = make_node_key()
        if (out / "nodes" / name).exists() and not args.force:
            print(f"kept {out / 'nodes' / name} (exists; --force replaces it)")
            continue
        _write(out / "nodes" / name, private, True, True)
        _write(out / "nodes" / f"{name}.pub", public, False, True)


if __name__ == "__main__":
    main()
