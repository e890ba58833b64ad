"""`edgec generate`: a build compiled with `--generate` generating tokens on the devices' workers, each layer's
caches kept on its device (runtime/generate/)."""

from __future__ import annotations

import json

import click

from ..command import EXIT_OK, EXIT_VERIFY_FAILED, Finite, RunCommand
from ..errors import InputError
from ..generate.api import MAX_SEQUENCES, generate as generate_api
from ..machine import MAX_THREADS_HERE
from ..wire.keys import COORDINATOR
from ..wire.protocol import MAX_TEMPERATURE
from .api import parse_addresses
from .kit import SEED, TIMEOUT, TOLERANCE, command_exit_code

__all__ = ["generate", "parse_prompt_ids"]

_EPILOG = ("Exit codes: 0 ok, 1 verification failed, 2 bad input (a build not compiled with --generate, bad token "
           "ids, a prompt and new tokens beyond the build's max context), 3 run failure (a worker failed, died or "
           "timed out; a device lost mid-generation on a build compiled with --fallbacks restarts the unfinished "
           "sequences on the fallback plan without it instead).")


@click.command("generate", cls=RunCommand, epilog=_EPILOG, context_settings={"show_default": True})
@click.argument("build", type=click.Path())
@click.option("--prompt-ids", metavar="ID,ID,...", help="The prompt's token ids, comma-separated (every sequence's).")
@click.option("--random-prompt", type=click.IntRange(min=1), metavar="P",
              help="Instead of --prompt-ids: P random token ids per sequence (from --seed).")
@click.option("--max-new-tokens", type=click.IntRange(min=1), required=True, metavar="N",
              help="Tokens to generate per sequence; the prompt and N must fit in the build's --max-context.")
@click.option("--sequences", type=click.IntRange(min=1, max=MAX_SEQUENCES), default=1, metavar="S",
              help="Independent sequences in flight at once (pipelined: each stage busy with another sequence).")
@click.option("--temperature", type=Finite(min=0, max=MAX_TEMPERATURE), default=0.0, metavar="T",
              help="0: greedy (the largest logit); above 0: sampled from softmax(logits / T), reproducibly from --seed. "
                   "The device that computes the logits chooses; only the token id leaves it.")
@click.option("--seed", type=SEED, default=0, help="Seed for --random-prompt and for sampling.")
@click.option("--verify", is_flag=True,
              help="Run the source model's own decode loop in onnxruntime and check every token, and every step's "
                   "logits within the plan's providers' tolerance.")
@click.option("--model", "model_file", metavar="MODEL.onnx", show_default="the manifest's model path",
              help="The source model for --verify, when the build folder was moved away from it.")
@click.option("--tolerance", type=TOLERANCE, default=None, show_default="the plan's providers'",
              help="With --verify: pass when max|a-b| <= tolerance * max(1, max|reference|) for each step's logits.")
@click.option("--threads", type=click.IntRange(min=0, max=MAX_THREADS_HERE), default=None,
              show_default="cores / devices", help="onnxruntime intra-op threads per local worker.")
@click.option("--timeout", type=TIMEOUT, default=60.0, help="Seconds allowed for start-up and for each step.")
@click.option("--addresses", "address_pairs", multiple=True, metavar="NAME=tcp://HOST:PORT",
              help="Reach device NAME's `edgec worker` there, instead of the manifest's address (repeatable).")
@click.option("--keys", "keys_dir", type=click.Path(file_okay=False), metavar="DIR",
              help=f"The cluster's keys folder (`edgec keygen`), as `edgec run --keys` (DIR/private/{COORDINATOR}"
                   ".key_secret).")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object on stdout.")
@click.pass_context
def generate(ctx: click.Context, build, prompt_ids, random_prompt, max_new_tokens, sequences, temperature, seed,
             verify, model_file, tolerance, threads, timeout, address_pairs, keys_dir, as_json) -> None:
    """Generate tokens with BUILD (compiled with `edgec compile --generate`) on the devices' workers. With one
    sequence, its tokens go to stdout as they come; with several, one line per sequence at the end."""

    def body() -> int:
        ids = None if prompt_ids is None else parse_prompt_ids(prompt_ids)
        streaming = sequences == 1 and not as_json
        on_token = (lambda _, token: click.echo(f"{token} ", nl=False)) if streaming else None
        result = generate_api(build, prompt_ids=ids, random_prompt=random_prompt, max_new_tokens=max_new_tokens,
                              sequences=sequences, temperature=temperature, seed=seed, verify=verify,
                              model=model_file, tolerance=tolerance, threads=threads, timeout=timeout,
                              addresses=parse_addresses(address_pairs), keys=keys_dir, on_token=on_token)
        checked = result["verify"]
        if as_json:
            click.echo(json.dumps(result))
        else:
            _print(result, streaming)
        return EXIT_VERIFY_FAILED if checked is not None and not checked["passed"] else EXIT_OK

    ctx.exit(command_exit_code(body))


def parse_prompt_ids(text: str) -> list[int]:
    """`1,2,3` as [1, 2, 3]; one line naming the first item that is not a token id."""
    ids = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit():
            raise InputError(f"--prompt-ids {text[:80]!r}: {item[:40]!r} is not a token id (an integer >= 0)")
        ids.append(int(item))
    return ids


def _print(result: dict, streamed: bool) -> None:
    if streamed:
        click.echo()
    else:
        for i, s in enumerate(result["sequences"]):
            click.echo(f"sequence {i}: {' '.join(map(str, s['tokens']))}")
    tpot = result["tpot_ms"]
    click.echo(f"edgec: first token after {result['ttft_ms']:.1f} ms, "
               + (f"{tpot:.2f} ms per later token, " if tpot is not None else "")
               + f"{result['tokens_per_s']:.1f} tokens/s over {len(result['sequences'])} sequence(s)", err=True)
    for f in result["failovers"]:
        click.echo(f"failover: device {f['device']} lost after {f['after_tokens']} token(s); every unfinished sequence "
                   f"restarted its prefill on {f['plan']} and finished there", err=True)
    checked = result["verify"]
    if checked is not None:
        verdict = "PASS" if checked["passed"] else "FAIL"
        where = "" if checked["mismatch"] is None else \
            " (first different token: sequence {sequence}, step {step}: {token}, expected {expected})".format(
                **checked["mismatch"])
        click.echo(f"verify: {verdict}  tokens {'equal' if checked['tokens_match'] else 'differ'}, logits max|diff| "
                   f"{checked['max_abs_diff']:.3g} (tolerance {checked['tolerance']:g}){where}")
