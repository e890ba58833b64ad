"""Cluster keys: ZeroMQ CURVE certificates written and read with pyzmq's zmq.auth (no cryptography here).

Layout of a keys folder (`edgec keygen DIR --name pi5-a --name pi5-b ...` writes it):

  DIR/public/NAME.key           the public certificate of every member: copy the whole public/ folder to
                                every machine. A worker and the coordinator accept only peers whose public
                                key is in their public/ folder.
  DIR/private/NAME.key_secret   NAME's secret certificate (mode 0600): copy only NAME's to machine NAME.

Members are the devices, by their name in cluster.yaml (a worker's key must carry the name of the device it
serves: the coordinator authenticates the worker at a device's address with DIR/public/DEVICE.key), and
"coordinator", the machine that runs `edgec run --keys DIR`.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from .errors import InputError

__all__ = ["COORDINATOR", "Keyring", "keygen", "ephemeral_keyring", "check_member_name", "names_from_file"]

logger = logging.getLogger(__name__)

COORDINATOR = "coordinator"
PUBLIC, PRIVATE = "public", "private"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_member_name(name: str, where: str = "name") -> str:
    """A member name must also be a safe file name: letters, digits, '.', '_' and '-', not starting with '.'."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InputError(f"{where} {name!r}: a key name is 1-128 letters, digits, '.', '_' or '-' "
                         "(starting with a letter or digit)")
    return name


def keygen(folder: str | os.PathLike, names: Iterable[str]) -> list[tuple[str, bool]]:
    """Write a key pair for every name not in `folder` yet; returns (name, created) for each name, in order.
    A name whose two files both exist is kept (never overwritten); a half-present pair is an error."""
    root = Path(folder)
    wanted = list(dict.fromkeys(check_member_name(n) for n in names))
    public, private = root / PUBLIC, root / PRIVATE
    for name in wanted:
        have = [(public / f"{name}.key").exists(), (private / f"{name}.key_secret").exists()]
        if any(have) and not all(have):
            missing = public / f"{name}.key" if not have[0] else private / f"{name}.key_secret"
            raise InputError(f"{missing}: missing while the other half of {name}'s key pair exists; delete "
                             f"{name}'s remaining file to create a new pair")
    try:
        public.mkdir(parents=True, exist_ok=True)
        private.mkdir(parents=True, exist_ok=True)
        private.chmod(0o700)
    except OSError as exc:
        raise InputError(f"{root}: cannot create the keys folder ({exc.strerror or exc})") from None
    results = []
    for name in wanted:
        if (public / f"{name}.key").exists():
            results.append((name, False))
            continue
        _create_pair(root, name)
        results.append((name, True))
    return results


def ephemeral_keyring(members: Iterable[str]) -> Keyring:
    """Fresh key pairs for the coordinator and `members`, in a new private temporary folder (mode 0700), loaded
    as the coordinator's keyring. For a run whose workers are all processes this one starts: their sockets are
    then CURVE like any other, so no other process on the machine can feed them tensors. The caller removes
    `Keyring.folder` when the run ends (the workers read their keys when they start)."""
    folder = Path(tempfile.mkdtemp(prefix="edgec-run-keys-"))
    try:
        keygen(folder, [COORDINATOR, *members])
        return Keyring.load(folder, COORDINATOR)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def _create_pair(root: Path, name: str) -> None:
    """Both files appear, or neither: written in a scratch folder inside `root`, then moved into place."""
    scratch = Path(tempfile.mkdtemp(dir=root, prefix=".keygen-"))
    try:
        pub, sec = zmq.auth.create_certificates(scratch, name)
        os.chmod(sec, 0o600)
        os.replace(sec, root / PRIVATE / f"{name}.key_secret")
        os.replace(pub, root / PUBLIC / f"{name}.key")
    except OSError as exc:
        raise InputError(f"{root}: cannot write {name}'s keys ({exc.strerror or exc})") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def names_from_file(path: str | os.PathLike) -> list[str]:
    """The device names of a cluster file (YAML or JSON) or of a manifest.json: its `devices[].name`."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    data = _load_structured(p, text)
    devices = data.get("devices") if isinstance(data, dict) else None
    if not isinstance(devices, list) or not devices:
        raise InputError(f"{p}: expected a 'devices' list (a cluster file or a manifest.json)")
    names = []
    for i, d in enumerate(devices):
        name = d.get("name") if isinstance(d, dict) else None
        names.append(check_member_name(name, f"{p}: devices[{i}].name"))
    return names


def _load_structured(p: Path, text: str):
    import json

    if p.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise InputError(f"{p}: not valid JSON ({exc})") from None
    try:
        import yaml  # the full distribution has it; a device-only install gives names with --name instead
    except ImportError:
        raise InputError(f"{p}: reading YAML needs PyYAML (not part of edgec-runtime); pass the names with "
                         "--name, or give a manifest.json") from None
    try:
        return yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as exc:
        raise InputError(f"{p}: not valid YAML ({type(exc).__name__})") from None


@dataclass
class Keyring:
    """This machine's key pair (`name`) and the public keys it trusts (every DIR/public/*.key)."""

    folder: Path
    name: str
    public: bytes  # z85, as zmq's socket options take it
    secret: bytes
    trusted: dict[str, bytes] = field(default_factory=dict)  # member name -> z85 public key

    @classmethod
    def load(cls, folder: str | os.PathLike, name: str | None = None) -> "Keyring":
        """Load `name`'s secret key (default: the only one in DIR/private) and every public key."""
        root = Path(folder)
        public, private = root / PUBLIC, root / PRIVATE
        if not public.is_dir() or not private.is_dir():
            raise InputError(f"{root}: not a keys folder (expected {PUBLIC}/ and {PRIVATE}/ inside; create one "
                             "with `edgec keygen`)")
        name = _own_name(private, name)
        secret_file = private / f"{name}.key_secret"
        own_public, secret = _read_cert(secret_file)
        if secret is None:
            raise InputError(f"{secret_file}: holds no secret key")
        mode = secret_file.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            logger.warning("%s: readable by other users (mode %o); chmod 600 it", secret_file, mode & 0o777)
        trusted = {}
        for cert in sorted(public.glob("*.key")):
            trusted[cert.stem] = _read_cert(cert)[0]
        if trusted.get(name) != own_public:
            raise InputError(f"{public / (name + '.key')}: missing or not the public half of {secret_file}")
        return cls(root, name, own_public, secret, trusted)

    def key_of(self, member: str) -> bytes:
        key = self.trusted.get(member)
        if key is None:
            raise InputError(f"{self.folder / PUBLIC / (member + '.key')}: no public key for {member!r} (create it "
                             f"with `edgec keygen {self.folder} --name {member}` and copy it to every machine)")
        return key

    def is_trusted(self, z85: str | bytes) -> bool:
        key = z85.encode() if isinstance(z85, str) else z85
        return key in self.trusted.values()

    def serve(self, sock: zmq.Socket) -> None:
        """Make `sock` (before bind) a CURVE server with this machine's key pair."""
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_server = True

    def connect_to(self, sock: zmq.Socket, server_key: bytes) -> None:
        """Make `sock` (before connect) a CURVE client of the server whose public key is `server_key`."""
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_serverkey = server_key

    def authenticator(self, ctx: zmq.Context) -> ThreadAuthenticator:
        """Started ZAP handler for `ctx`: CURVE clients must hold a key from DIR/public (stop it when done)."""
        auth = ThreadAuthenticator(ctx, log=logging.getLogger("edgec.runtime.auth"))
        auth.start()
        auth.configure_curve(domain="*", location=str(self.folder / PUBLIC))
        return auth


def _own_name(private: Path, name: str | None) -> str:
    if name is not None:
        check_member_name(name)
        if not (private / f"{name}.key_secret").is_file():
            raise InputError(f"{private / (name + '.key_secret')}: not found")
        return name
    mine = sorted(p.stem for p in private.glob("*.key_secret"))
    if len(mine) != 1:
        held = ", ".join(mine) if mine else "none"
        raise InputError(f"{private}: holds {len(mine)} secret keys ({held}); say which is this machine's with --name")
    return mine[0]


def _read_cert(path: Path) -> tuple[bytes, bytes | None]:
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not a readable key file ({exc})") from None
    if len(public) != 40 or (secret is not None and len(secret) != 40):
        raise InputError(f"{path}: not a CURVE key file (keys are 40 z85 characters)")
    return public, secret
