"""Hostile input: a downloaded model's metadata or a file's name holding escape sequences (set the
window title, clear the screen, ring the bell) is printed with its control characters escaped, as the
CPU's model name already was; a projector (--mmproj) whose hyper-parameters clip.cpp refuses is
refused naming the key."""

from __future__ import annotations

import http.server
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.cli import run_cli
from tests.support.gguf_rewrite import rewrite

from offload_planner.core.synth import SMALL_MODELS, write_model
from offload_planner.core.synth.mmproj import SMALL_MMPROJ, write_mmproj

#: sets the terminal's title, clears the screen, rings the bell
EVIL = "\x1b]0;pwned\x07\x1b[2J\x9b31m evil"
ESCAPED = "\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m evil"


def _clean(text: str) -> None:
    assert not any(c in text for c in "\x1b\x07\x9b"), text[:2000]


def test_inspect_escapes_an_escape_sequence_in_the_models_name(tmp_path: Path,
                                                              small_models: dict[str, Path]) -> None:
    """general.name was printed raw: opening a downloaded model retitled and cleared the terminal."""
    model = rewrite(small_models["qwen3moe"], tmp_path / "evil.gguf", text=("general.name", EVIL))
    r = run_cli("inspect", str(model))
    assert r.returncode == 0, r.stderr[-2000:]
    _clean(r.stdout + r.stderr)
    assert r.stdout.splitlines()[0] == ESCAPED


def test_an_error_naming_a_file_escapes_its_name(tmp_path: Path) -> None:
    """The error line quoted the name as it was: a name with an escape sequence reached the terminal."""
    bad = tmp_path / f"{EVIL}.gguf"
    bad.write_bytes(b"junkjunkjunkjunk")
    for command in ("inspect", "plan", "fit"):
        r = run_cli(command, str(bad))
        assert r.returncode == 2, r.stderr[-2000:]
        _clean(r.stderr)
        assert r.stderr.startswith(f"offload-planner: error: {tmp_path}/{ESCAPED}.gguf"), r.stderr
        assert len(r.stderr.splitlines()) == 1, r.stderr


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The small Gemma 3 text model and its vision projector."""
    root = tmp_path_factory.mktemp("hostile9_mmproj")
    text = write_model(SMALL_MODELS["gemma3"], root / "gemma3.gguf")[0]
    return text, write_mmproj(SMALL_MMPROJ["gemma3"], root / "mmproj.gguf")


@pytest.mark.parametrize(("key", "value", "said"), [
    ("clip.vision.patch_size", 0, "patch_size (0) must be positive and less than 65536"),
    ("clip.vision.projector.scale_factor", 0, "n_merge (0) must be greater than 0 and less than 65536"),
    ("clip.vision.image_size", 4_000_000_000, "image_size (-294967296) cannot be negative"),
    ("clip.vision.image_size", 8193, "image_size (8193) is too large (max 8192)"),
    ("clip.vision.embedding_length", 0, "n_embd (0) must be greater than 0"),
    ("clip.vision.attention.head_count", 0, None),
])
def test_a_projector_clip_refuses_is_refused_naming_the_key(tmp_path: Path, gemma3: tuple[Path, Path],
                                                            key: str, value: int, said: str | None) -> None:
    """A patch size, merge or head count of 0 was a ZeroDivisionError traceback; an image size of 4e9 a
    projection of 300 million TiB; a width of 0 a plan of a projector llama-server refuses to load.
    Now the values clip.cpp's sanity check refuses are refused in its words, naming file and key."""
    text, mmproj = gemma3
    bad = rewrite(mmproj, tmp_path / "bad-mmproj.gguf", u32=(key, value))
    for command in ("plan", "fit"):
        r = run_cli(command, str(text), "--device", "CUDA0=24GiB", "--", "-c", "4096", "-mm", str(bad))
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        line = r.stderr.strip()
        assert line.startswith(f"offload-planner: error: {bad}: mmproj: {key} = {value}: "), line
        assert len(line.splitlines()) == 1, line
        if said is not None:
            assert f"llama.cpp's clip loader refuses it ({said}) and llama-server exits" in line, line


def test_the_largest_image_clip_takes_is_still_planned(tmp_path: Path, gemma3: tuple[Path, Path]) -> None:
    text, mmproj = gemma3
    wide = rewrite(mmproj, tmp_path / "a.gguf", u32=("clip.vision.image_size", 8192))
    big = rewrite(wide, tmp_path / "b.gguf", u32=("clip.vision.patch_size", 1))
    r = run_cli("plan", str(text), "--device", "CUDA0=24GiB", "--json", "--", "-c", "4096", "-mm", str(big))
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_huge_model_name_is_cut_in_the_summary(tmp_path: Path, small_models: dict[str, Path]) -> None:
    """A 5 MB general.name took the window 9 s to show (the model line elided it on every layout) and
    inspect printed all of it; the summary keeps 200 characters."""
    model = rewrite(small_models["qwen3moe"], tmp_path / "long.gguf", text=("general.name", "n" * 5_000_000))
    r = run_cli("inspect", str(model))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[0] == "n" * 199 + "…"


def test_a_huge_architecture_name_is_refused_in_one_short_line(tmp_path: Path,
                                                               small_models: dict[str, Path]) -> None:
    """A 2 MB general.architecture went into every key looked up and into the missing key's message:
    a 2 MB error line, 17 s before the window said it. llama.cpp knows no such architecture."""
    model = rewrite(small_models["qwen3moe"], tmp_path / "arch.gguf",
                    text=("general.architecture", "a" * 2_000_000))
    for command in ("inspect", "plan"):
        r = run_cli(command, str(model))
        assert r.returncode == 2 and len(r.stderr) < 400, r.stderr[:2000]
        assert "key 'general.architecture': 2,000,000 characters ('aaaa" in r.stderr, r.stderr[:2000]


def test_a_drafts_huge_tokenizer_name_is_cut_in_the_warning(tmp_path: Path,
                                                           small_models: dict[str, Path]) -> None:
    """A draft whose tokenizer.ggml.model was 2 MB gave a 2 MB warning line (the tokenizers differ)."""
    draft = rewrite(small_models["qwen3moe"], tmp_path / "draft.gguf",
                    text=("tokenizer.ggml.model", "t" * 2_000_000))
    r = run_cli("plan", str(small_models["qwen3moe"]), "--device", "CUDA0=24GiB", "--", "-c", "4096", "-md",
                str(draft), "--spec-type", "draft-simple")
    assert r.returncode == 0, r.stderr[-2000:]
    said = [ln for ln in (r.stdout + r.stderr).splitlines() if "the tokenizers differ" in ln]
    assert len(said) == 1 and len(said[0]) < 600 and "t" * 79 + "…" in said[0], [s[:300] for s in said]


def test_a_huge_projector_type_is_refused_in_one_short_line(tmp_path: Path,
                                                            gemma3: tuple[Path, Path]) -> None:
    """A 2 MB clip.projector_type went whole into the note naming a type without a compute graph."""
    text, mmproj = gemma3
    bad = rewrite(mmproj, tmp_path / "bad-mmproj.gguf", text=("clip.projector_type", "p" * 2_000_000))
    r = run_cli("plan", str(text), "--device", "CUDA0=24GiB", "--", "-c", "4096", "-mm", str(bad))
    assert r.returncode == 2 and len(r.stdout + r.stderr) < 600, (r.stdout + r.stderr)[:2000]
    assert f"{bad}: mmproj: clip.projector_type is 2,000,000 characters ('pppp" in r.stderr, r.stderr


class _Hostile(http.server.BaseHTTPRequestHandler):
    """/loop redirects to itself; /reason answers 500 with a 60 KB reason phrase."""

    def do_GET(self) -> None:
        if self.path.startswith("/loop"):
            self.send_response(302)
            self.send_header("Location", "/loop.gguf")
        else:
            self.send_response(500, "\x1b[2J" + "r" * 60_000)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def hostile_http() -> Iterator[str]:
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Hostile)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize(("path", "said"), [
    ("/loop.gguf", "redirected in a loop or more than 10 times (the last: HTTP 302)"),
    ("/reason.gguf", "HTTP 500 \\x1b[2J" + "r" * 195 + "…"),
])
def test_a_hostile_http_answer_is_one_short_line(hostile_http: str, path: str, said: str) -> None:
    """A redirect loop was urllib's three lines; a 60 KB reason phrase a 60 KB error line."""
    r = run_cli("inspect", hostile_http + path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr == f"offload-planner: error: {hostile_http}{path}: {said}\n", r.stderr[:2000]


def test_a_token_with_a_line_break_is_refused_without_quoting_it() -> None:
    """http.client refused the header and its message, printed as the error, quoted the token."""
    r = run_cli("inspect", "https://huggingface.co/org/repo/resolve/main/m.gguf",
                HF_TOKEN="hf_secret123\nhf_second")
    assert r.returncode == 2, r.stderr[-2000:]
    assert "hf_secret123" not in r.stderr and "hf_second" not in r.stderr, r.stderr
    assert "HF_TOKEN holds a space, a line break or another character a token has not" in r.stderr, r.stderr
