"""What a llama-server command can do besides loading a model: secrets it carries, and flags that
expose the server, write files, run tools or reach other machines.

Used before a plan read from a file is launched (the command is shown with these flags named) and
when a plan is saved (secret values are never written to a plan file). The flags and what they do
are from the pinned build's ``common/arg.cpp``; every spelling is matched through the dialect's flag
table (``-hft``/``--hf-token``/``--hf_token``), and values given through ``LLAMA_ARG_*`` variables
are reviewed when the environment is passed.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from offload_planner.core.cmdline import Dialect, flag_table, parse_server_args
from offload_planner.core.cmdline.flagspec import normalize_spelling
from offload_planner.core.cmdline.rpc_endpoint import rpc_host
from offload_planner.core.cmdline.secrets import SECRET_FLAGS, is_secret, masked

#: Flags whose value is a path the server writes to (arg.cpp): its log, the prompts it logs, slot
#: KV caches saved on a client's request, the n-gram cache updated by generation.
WRITES = {
    "--log-file": "writes its log to {v}",
    "--log-prompts-dir": "writes every prompt to files under {v} (creating the folder)",
    "--slot-save-path": "saves slot KV caches under {v} when a client asks",
    "--lookup-cache-dynamic": "updates the lookup cache file {v} as it generates",
    "--prompt-cache": "writes a prompt cache to {v}",
}
#: Flags that let clients (or the network) reach more than the model, or run more than it.
EXPOSES = {
    "--path": ("exposes", "serves the files under {v} over HTTP"),
    "--media-path": ("exposes", "lets clients read local files under {v} (file:// URLs)"),
    "--cors-origins": ("exposes", "lets web pages from {v} call the server from a browser"),
    "--props": ("exposes", "lets clients change the server's global properties (POST /props)"),
    "--tools": ("runs", "lets clients run built-in tools ({v}: shell commands, file reads and writes)"),
    "--agent": (
        "runs",
        "lets clients run every built-in tool (shell commands, file writes) and the MCP proxy",
    ),
    "--tools-runtime": ("runs", "runs tools in {v}"),
    "--ui-mcp-proxy": ("exposes", "turns on the MCP CORS proxy (arg.cpp: not for untrusted environments)"),
    "--mcp-servers-config": ("runs", "starts the MCP servers defined in {v}"),
    "--mcp-servers-json": ("runs", "starts the MCP servers defined inline"),
    "--models-dir": ("runs", "router mode: starts a llama-server for any model under {v}"),
    "--models-preset": ("runs", "router mode: starts llama-servers with the arguments in {v}"),
}
#: Flags that download from the network.
DOWNLOADS = {
    "--model-url": "downloads the model from {v}",
    "--hf-repo": "downloads {v} from Hugging Face",
    "--docker-repo": "downloads {v} from Docker Hub",
    "--spec-draft-hf": "downloads the draft model {v} from Hugging Face",
}


@dataclass(frozen=True)
class Concern:
    """One flag of a command that does more than load and serve the model."""

    flag: str  # as written (or the LLAMA_ARG_* variable)
    what: str  # "exposes", "writes", "runs", "network"
    text: str

    def line(self) -> str:
        return f"{self.flag}: {self.text}"


def is_loopback(host: str) -> bool:
    h = host.strip().strip("[]").lower()
    if h == "localhost" or h.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def _dialect(dialect: Dialect) -> Dialect:
    try:
        return Dialect(dialect)
    except ValueError:
        return Dialect.LLAMA_CPP


def strip_secrets(
    args: Sequence[str], dialect: Dialect = Dialect.LLAMA_CPP
) -> tuple[list[str], list[str]]:
    """``args`` without the secret flags and their values, and the spellings removed.

    Other flags keep their values (read with the dialect's flag table, so that a value that
    happens to look like ``--api-key`` is not taken for the flag)."""
    table = flag_table(_dialect(dialect))
    kept: list[str] = []
    removed: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        secret, attached = is_secret(arg)
        if secret:
            removed.append(arg.split("=", 1)[0])
            i += 1 if attached else 2
            continue
        look = table.lookup(normalize_spelling(arg))
        n = 1 + (look.spec.arity if look is not None and look.positive else 0)
        kept += args[i : i + n]
        i += n
    return kept, removed


def _hosts(value: str) -> list[str]:
    return [h.strip() for h in value.split(",") if h.strip()]


def review_args(
    args: Sequence[str], dialect: Dialect = Dialect.LLAMA_CPP, env: Mapping[str, str] | None = None
) -> list[Concern]:
    """The flags of a llama-server command (no program name) that expose the server, write files,
    run tools, download or send tensors to other machines, in command-line order."""
    parsed = parse_server_args(list(args), dialect=_dialect(dialect), env=env)
    out: list[Concern] = []
    keys = {f.key for f in parsed.flags}
    has_key = bool(keys & {"--api-key", "--api-key-file"})
    models = 0
    for f in parsed.flags:
        name = f.env or f.spelling
        value = f.values[0] if f.values else ""
        if f.key == "--host":
            for h in _hosts(value):
                if not is_loopback(h) and not h.endswith(".sock"):
                    why = f"listens on {h}: other machines can reach the server"
                    out.append(
                        Concern(name, "exposes", why + ("" if has_key else ", and no --api-key is set"))
                    )
        elif f.key == "--rpc":
            for ep in _hosts(value):
                if not is_loopback(rpc_host(ep)):
                    out.append(Concern(name, "network", f"sends the model's tensors to the RPC server {ep}"))
        elif f.key == "--model":
            models += 1
            if models > 1:
                out.append(Concern(name, "runs", f"loads another model file: {value}"))
        elif f.key in WRITES:
            out.append(Concern(name, "writes", WRITES[f.key].format(v=value)))
        elif f.key in EXPOSES and f.positive:
            what, text = EXPOSES[f.key]
            out.append(Concern(name, what, text.format(v=value)))
        elif f.key in DOWNLOADS:
            out.append(Concern(name, "network", DOWNLOADS[f.key].format(v=value)))
        elif f.key in SECRET_FLAGS:
            out.append(Concern(name, "secret", "carries a secret (its value is not shown)"))
    return out


__all__ = ["SECRET_FLAGS", "Concern", "is_loopback", "masked", "review_args", "strip_secrets"]
