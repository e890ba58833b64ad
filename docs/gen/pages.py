"""mkdocs-gen-files script (mkdocs.yml): writes the generated pages at every `mkdocs build`, so that the
reference and the benchmark tables cannot drift from the code and from benchmarks/results."""

from __future__ import annotations

import sys
from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "docs" / "gen"), str(ROOT / "benchmarks")]

import jsonout  # noqa: E402
import reference  # noqa: E402
import render  # noqa: E402
from meanings import MEANINGS  # noqa: E402

from edgec.compiler.allocate.services import ServicesDoc  # noqa: E402
from edgec.compiler.cluster.schema import ClusterDoc, ProfileDoc  # noqa: E402

EXAMPLES = ROOT / "examples"


def _write(path: str, text: str) -> None:
    with mkdocs_gen_files.open(path, "w") as f:
        f.write(text)


_write("reference/cli.md", reference.cli_page())
_write("reference/cluster.md", reference.schema_page(
    "cluster.yaml", "The devices a model is compiled for, the network between them and, optionally, the machines "
    "they share. Unknown keys, missing keys, non-positive bandwidth or memory, negative latency, numbers that are "
    "not finite or above 1e12, unknown profiles, duplicate device names, links naming unknown devices, YAML nested "
    "more than 32 levels and files over 1 MiB are errors (exit 2, one line). Example clusters: "
    "`tests/e2e/clusters/*.yaml` and `examples/*/cluster.yaml`.",
    ClusterDoc, MEANINGS, (ROOT / "examples" / "three-pis" / "cluster.yaml").read_text(encoding="utf-8")))
_write("reference/services.md", reference.schema_page(
    "services.yaml", "The models `edgec allocate` places on one cluster ([how-to](../how-to/several-models.md)).",
    ServicesDoc, MEANINGS, (ROOT / "examples" / "two-services" / "services.yaml").read_text(encoding="utf-8")))
_write("reference/profile.md", reference.schema_page(
    "Device profiles", "A device's figures for the cost model. Shipped: " + ", ".join(
        f"`{p.stem}`" for p in sorted((ROOT / "profiles").glob("*.yaml"))) + ". The shipped ones are estimates "
    "from published benchmarks and datasheets (each says where in `sources`); `edgec profile` measures a real "
    "device ([how-to](../how-to/profile.md)). Profile files may be up to 16 MiB.",
    ProfileDoc, MEANINGS, (ROOT / "profiles" / "rpi5.yaml").read_text(encoding="utf-8")))
_write("reference/manifest.md", reference.manifest_page())
_write("reference/models.md", reference.models_page())
_write("reference/json.md", jsonout.json_page())
_write("reference/protocol.md", "# Network protocol\n\nWorkers and coordinators of this release speak network "
       f"protocol **{reference.protocol_version()}** (`edgec.runtime.wire.protocol.PROTOCOL_VERSION`, read when this "
       "page was built). A worker of another protocol version is refused with one line (exit 2): run the same "
       "edgec version on every device. See [the security model](../explanation/security.md) for what travels "
       "on the wire.\n")
for name, text in render.pages(link_prefix="../").items():
    _write(f"benchmarks/{name}", text)
