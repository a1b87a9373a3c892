"""Throw-away certificate authorities for the TLS and mTLS tests, made with the openssl CLI.

Two CAs, as in a real deployment: one signs the server's certificate (clients trust it), the
other signs client certificates (the server's ``--tls-client-ca``). A "rogue" client certificate
is signed by the *server* CA, so a test can show the server checks client certificates against
the client CA and not merely "some CA it has seen". EC P-256 keys: fast to make, and what gRPC's
BoringSSL prefers anyway.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Pki", "have_openssl", "make_pki"]

SAN = "subjectAltName=DNS:localhost,IP:127.0.0.1"


def have_openssl() -> bool:
    return shutil.which("openssl") is not None


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files; ``read(name)`` gives the bytes a gRPC credential wants."""

    directory: Path

    def path(self, name: str) -> Path:
        return self.directory / name

    def read(self, name: str) -> bytes:
        return (self.directory / name).read_bytes()


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _key(name: str, cwd: Path) -> None:
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key", cwd=cwd)


def _ca(name: str, cwd: Path) -> None:
    _key(name, cwd)
    _openssl("req", "-x509", "-new", "-key", f"{name}.key", "-days", "2",
             "-subj", f"/CN={name}", "-out", f"{name}.pem", cwd=cwd)  # fmt: skip


def _leaf(name: str, ca: str, cwd: Path) -> None:
    _key(name, cwd)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", f"/CN={name}",
             "-out", f"{name}.csr", cwd=cwd)  # fmt: skip
    (cwd / f"{name}.ext").write_text(SAN + "\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
             "-out", f"{name}.pem", cwd=cwd)  # fmt: skip


def make_pki(directory: Path) -> Pki:
    """``ca`` signs ``server``; ``client-ca`` signs ``client``; ``ca`` also signs ``rogue``."""
    directory.mkdir(parents=True, exist_ok=True)
    _ca("ca", directory)
    _ca("client-ca", directory)
    _leaf("server", "ca", directory)
    _leaf("client", "client-ca", directory)
    _leaf("rogue", "ca", directory)
    return Pki(directory)
