"""Cluster keys: ZeroMQ CURVE certificates written and read with pyzmq's zmq.auth (no cryptography here).

Layout of a keys folder (`edgec keygen DIR --name pi5-a --name pi5-b ...` writes it):

  DIR/public/NAME.key           the public certificate of every member: copy the whole public/ folder to
                                every machine. A worker and the coordinator accept only peers whose public
                                key is in their public/ folder.
  DIR/private/NAME.key_secret   NAME's secret certificate (mode 0600): copy only NAME's to machine NAME.

Members are the devices, by their name in cluster.yaml (a worker's key must carry the name of the device it
serves: the coordinator authenticates the worker at a device's address with DIR/public/DEVICE.key), and
"coordinator", the machine that runs `edgec run --keys DIR`.

Roles: the key named "coordinator" (DIR/public/coordinator.key) is the only one a worker accepts a run from
(start a session, push fragments, run requests). The devices' keys only carry tensors between workers: a
device holding its own secret key cannot take over another device's worker. A worker's keys folder must
therefore hold public/coordinator.key. Machines that each run `edgec run` share the coordinator's pair.

A run whose workers are all processes it starts (no --keys, no worker addresses) makes its keys in memory
(`ephemeral_keyring`) and hands each local worker its pair through the worker's stdin: no key touches the
disk, so a run killed with SIGKILL leaves none behind.
"""

from __future__ import annotations

import json
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

from ..errors import InputError

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
    """Fresh key pairs for the coordinator and `members`, made and kept in memory (never written to disk),
    as the coordinator's keyring; `member_json(name)` is what the local worker of `name` reads on its stdin
    (`edgec worker --keys-stdin`). For a run whose workers are all processes this one starts: their sockets
    are then CURVE like any other, so no other process on the machine can feed them tensors."""
    pairs = {name: zmq.curve_keypair() for name in [COORDINATOR, *members]}
    public, secret = pairs.pop(COORDINATOR)
    return Keyring(None, COORDINATOR, public, secret,
                   {COORDINATOR: public, **{name: pub for name, (pub, _) in pairs.items()}},
                   {name: sec for name, (_, sec) in pairs.items()})


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
    """This machine's key pair (`name`) and the public keys it trusts (every DIR/public/*.key); `folder` is
    None for keys that live in memory only (`ephemeral_keyring`, `from_json`). `secrets` holds the secret
    keys of other members that this keyring hands to the local workers it starts (ephemeral keys only)."""

    folder: Path | None
    name: str
    public: bytes  # z85, as zmq's socket options take it
    secret: bytes
    trusted: dict[str, bytes] = field(default_factory=dict)  # member name -> z85 public key
    secrets: dict[str, bytes] = field(default_factory=dict, repr=False)  # member name -> z85 secret key

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

    @property
    def where(self) -> str:
        """Where the public keys come from, for messages."""
        return f"{self.folder / PUBLIC}" if self.folder is not None else "the run's own keys"

    def coordinator_key(self) -> bytes:
        """The public key a worker accepts runs from (DIR/public/coordinator.key); InputError without one."""
        key = self.trusted.get(COORDINATOR)
        if key is None:
            where = self.folder / PUBLIC / f"{COORDINATOR}.key" if self.folder is not None else "the keys given"
            raise InputError(f"{where}: missing; a worker accepts runs only from the coordinator's key (copy "
                             "the cluster's whole public/ folder, made by `edgec keygen`, to this machine)")
        return key

    def serves_as(self, member: str) -> str:
        """The key a worker started here for `member` serves with: the member's own when this machine holds
        its secret (in memory, or DIR/private/MEMBER.key_secret), else this machine's."""
        if member in self.secrets:
            return member
        own = self.folder is not None and (self.folder / PRIVATE / f"{member}.key_secret").is_file()
        return member if own else self.name

    def member(self, name: str) -> "Keyring":
        """The keyring of member `name`, whose secret this keyring holds (in memory, or in its folder)."""
        if name == self.name:
            return self
        if name in self.secrets:
            return Keyring(None, name, self.trusted[name], self.secrets[name], dict(self.trusted))
        return Keyring.load(self.folder, name)

    def member_json(self, name: str) -> bytes:
        """`member(name)` as one line of JSON: what `edgec worker --keys-stdin` reads."""
        ring = self.member(name)
        return json.dumps({"name": ring.name, "public": ring.public.decode(), "secret": ring.secret.decode(),
                           "trusted": {n: k.decode() for n, k in ring.trusted.items()}}).encode() + b"\n"

    @classmethod
    def from_json(cls, line: bytes | str, where: str = "stdin") -> "Keyring":
        """The keyring `member_json` wrote (InputError naming `where` if it is not one)."""
        try:
            doc = json.loads(line)
            ring = cls(None, check_member_name(doc["name"]), doc["public"].encode(), doc["secret"].encode(),
                       {check_member_name(n): k.encode() for n, k in doc["trusted"].items()})
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InputError(f"{where}: not the keys of `edgec worker --keys-stdin` ({type(exc).__name__})") from None
        keys = [ring.public, ring.secret, *ring.trusted.values()]
        if any(len(k) != 40 for k in keys) or ring.trusted.get(ring.name) != ring.public:
            raise InputError(f"{where}: not the keys of `edgec worker --keys-stdin` (keys are 40 z85 characters)")
        return ring

    def key_of(self, member: str) -> bytes:
        key = self.trusted.get(member)
        if key is None:
            if self.folder is None:
                raise InputError(f"no key for {member!r} among the run's own keys")
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
        """Started ZAP handler for `ctx`: CURVE clients must hold one of the trusted keys (DIR/public, as read
        when this keyring was loaded); stop it when done. A frame's "User-Id" is then its sender's z85 key."""
        auth = ThreadAuthenticator(ctx, log=logging.getLogger("edgec.runtime.auth"))
        auth.start()
        auth.configure_curve_callback(domain="*", credentials_provider=_Trusted(frozenset(self.trusted.values())))
        return auth


@dataclass(frozen=True)
class _Trusted:
    """pyzmq's credentials provider: a CURVE client is let in when its public key is one of `keys` (z85)."""

    keys: frozenset

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.keys


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
