"""Opening GGUF models over HTTP: Range requests fetch only the header, on a real local server."""

from __future__ import annotations

import itertools
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
from tests.support.http_range_server import RangeServer, tls_cert_file

from offload_planner.core.errors import GGUFError
from offload_planner.core.gguf_reader import LazyArray, open_model, read_header
from offload_planner.core.model import Model
from offload_planner.core.remote import BLOCK_SIZE, HttpRangeSource

N_TOKENS = 60_000  # ~2.5 MB of header: the reader needs three reads (1, 2, then 4 MiB)
BIG = "big.gguf"
SPLIT = [f"m-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
Q8 = gguf.GGMLQuantizationType.Q8_0


def _write_big(path: Path) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_embedding_length(512)
    w.add_head_count(8)
    w.add_context_length(4096)
    w.add_string("test.note", "ünïcode")
    w.add_token_list([f"token_{i:06d}_{'x' * (i % 13)}" for i in range(N_TOKENS)])
    w.add_token_scores([float(i % 97) for i in range(N_TOKENS)])
    w.add_token_types([1] * N_TOKENS)
    w.add_tensor("token_embd.weight", np.zeros((2048, 512), dtype=np.float16))  # 2 MiB
    for layer in range(2):
        q8 = np.zeros((4096, 512 // 32 * 34), dtype=np.uint8)  # 2.1 MiB of q8_0 each
        w.add_tensor(f"blk.{layer}.ffn_up.weight", q8, raw_dtype=Q8)
        w.add_tensor(f"blk.{layer}.attn_q.weight", np.zeros((512, 512), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(512, dtype=np.float32))
    w.add_tensor("output.weight", np.zeros((16384, 512), dtype=np.float32))  # 32 MiB
    _finish(w)
    return path


def _finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _write_split(directory: Path, names: list[str] = SPLIT) -> None:
    """Three shards as gguf-split writes them: split.* keys, metadata in the first."""
    per_shard = [
        ["token_embd.weight", "blk.0.attn_q.weight"],
        ["blk.0.ffn_up.weight", "blk.1.attn_q.weight"],
        ["blk.1.ffn_up.weight", "output_norm.weight"],
    ]
    total = sum(len(t) for t in per_shard)
    for no, (name, tensors) in enumerate(zip(names, per_shard, strict=True)):
        w = gguf.GGUFWriter(str(directory / name), "llama")
        w.add_uint16("split.no", no)
        w.add_uint16("split.count", len(names))
        w.add_int32("split.tensors.count", total)
        if no == 0:
            w.add_block_count(2)
            w.add_embedding_length(256)
            w.add_token_list([f"t{i}" for i in range(5000)])
        for t in tensors:
            if "ffn_up" in t:
                w.add_tensor(t, np.zeros((512, 256 // 32 * 34), np.uint8), raw_dtype=Q8)
            else:
                w.add_tensor(t, np.full((256, 256) if "norm" not in t else 256, 0.5, np.float32))
        _finish(w)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("served")
    _write_big(d / BIG)
    _write_split(d)
    (d / "empty.gguf").write_bytes(b"")
    return d


@pytest.fixture(autouse=True)
def _no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)


def _token_for(monkeypatch: pytest.MonkeyPatch, srv: RangeServer, token: str) -> None:
    """HF_TOKEN, with the test server (https, its certificate trusted) as the Hugging Face endpoint
    (a mirror, as HF_ENDPOINT): the token goes only over https to that exact origin."""
    assert srv.tls, "the token is sent only over https"
    monkeypatch.setenv("HF_TOKEN", token)
    monkeypatch.setenv("HF_ENDPOINT", srv.base)
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_cert_file()))


@pytest.fixture
def server(files: Path) -> Iterator[RangeServer]:
    with RangeServer(files) as srv:
        yield srv


def _plain(v: object) -> object:
    return v.values() if isinstance(v, LazyArray) else v


def _snapshot(m: Model) -> dict[str, object]:
    """Everything of a model except where it was opened from."""
    return {
        "metadata": {k: _plain(v) for k, v in m.metadata.items()},
        "tensors": [
            (t.name, t.shape, t.type.name, t.nbytes, t.shard, t.offset, t.layer, t.role)
            for t in m.tensors
        ],
        "shards": [
            (
                s.file_size,
                s.data_offset,
                s.data_bytes,
                s.header_only,
                s.version,
                s.alignment,
                s.n_tensors,
            )
            for s in m.shards
        ],
        "total_bytes": m.total_bytes,
        "flavor": m.flavor,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_log(srv: RangeServer, n: int) -> None:
    """Handler threads log after their last write; wait for ``n`` entries (at most 5 s)."""
    deadline = time.monotonic() + 5
    while len(srv.log) < n and time.monotonic() < deadline:
        time.sleep(0.01)


# --- the same model from a URL as from the path --------------------------------------------


def test_url_opens_the_same_model_as_the_path(files: Path, server: RangeServer) -> None:
    local = open_model(files / BIG)
    remote = open_model(server.url(BIG))
    assert remote.path == server.url(BIG)
    assert remote.shards[0].path == server.url(BIG)
    assert _snapshot(remote) == _snapshot(local)
    assert len(local.tensors) == 7 and not remote.header_only
    tokens = remote.metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, LazyArray) and len(tokens) == N_TOKENS


def test_lazy_arrays_are_equal_from_a_url_and_a_path(
    files: Path, server: RangeServer
) -> None:
    """A lazy array keeps its own bytes whichever source it came from (a local file is walked in
    its memory map, a URL in a growing buffer): equal arrays, still decodable after closing."""
    local = open_model(files / BIG).metadata["tokenizer.ggml.tokens"]
    remote = open_model(server.url(BIG)).metadata["tokenizer.ggml.tokens"]
    assert isinstance(local, LazyArray) and remote == local
    assert remote.values() == local.values() and len(local.values()) == N_TOKENS


def test_only_the_header_is_downloaded(files: Path, server: RangeServer) -> None:
    size = (files / BIG).stat().st_size
    with HttpRangeSource(server.url(BIG)) as src:
        header = read_header(src)
        assert src.size == size
        assert header.data_offset > 2 * BLOCK_SIZE  # the header spans several reads
        assert src.request_count == 3  # 1 MiB, then up to 2 MiB, then up to 4 MiB
        assert src.bytes_fetched <= 2 * header.data_offset
        assert src.bytes_fetched < size / 8
    assert server.bytes_sent(at_least=src.bytes_fetched) == src.bytes_fetched
    asked = [r for r in server.ranges_asked() if r is not None]
    assert len(asked) == 3 and asked[0] == (0, BLOCK_SIZE - 1)
    for (_, end), (start, _) in itertools.pairwise(asked):
        assert start == end + 1  # contiguous, nothing fetched twice


def test_open_model_over_http_reads_only_the_header(files: Path, server: RangeServer) -> None:
    open_model(server.url(BIG))
    size = (files / BIG).stat().st_size
    assert all(r.status == 206 for r in server.log)
    assert 0 < server.bytes_sent() < size / 8


def test_repeated_reads_come_from_the_cache(server: RangeServer) -> None:
    with HttpRangeSource(server.url(BIG)) as src:
        assert src.request_count == 1 and src.bytes_fetched == BLOCK_SIZE
        a = src.read(100, 1000)
        b = src.read(100, 1000)
        assert a == b and len(a) == 1000
        assert src.request_count == 1
        c = src.read(BLOCK_SIZE - 10, 20)  # straddles into the second block: one request
        assert len(c) == 20 and src.request_count == 2
        assert src.read(BLOCK_SIZE - 10, 20) == c and src.request_count == 2
        assert src.read(src.size - 5, 100) == (Path(server.config.root) / BIG).read_bytes()[-5:]
        assert src.read(src.size, 10) == b"" and src.read(0, 0) == b""


def test_reads_match_the_file_bytes(files: Path, server: RangeServer) -> None:
    data = (files / BIG).read_bytes()
    with HttpRangeSource(server.url(BIG)) as src:
        for offset, n in [(0, 4), (5, BLOCK_SIZE * 3 + 7), (BLOCK_SIZE * 2 - 1, 2), (123457, 99)]:
            assert src.read(offset, n) == data[offset : offset + n]


def test_long_reads_are_split_into_bounded_requests(
    server: RangeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("offload_planner.core.remote.MAX_REQUEST_BYTES", 2 * BLOCK_SIZE)
    with HttpRangeSource(server.url(BIG)) as src:
        src.read(0, 7 * BLOCK_SIZE)
        assert src.request_count == 1 + 3  # the probe's block, then 2+2+2 blocks
        assert all(e - s + 1 <= 2 * BLOCK_SIZE for s, e in filter(None, server.ranges_asked()))


def test_download_budget_stops_a_runaway_header(server: RangeServer) -> None:
    with pytest.raises(GGUFError, match="would download more than") as ei:
        read_header(HttpRangeSource(server.url(BIG), max_bytes=2 * BLOCK_SIZE))
    assert server.url(BIG) in str(ei.value)
    assert server.bytes_sent() <= 2 * BLOCK_SIZE


# --- split models ----------------------------------------------------------------------------


def test_split_url_opens_every_shard(files: Path, server: RangeServer) -> None:
    local = open_model(files / SPLIT[0])
    remote = open_model(server.url(SPLIT[0]))
    assert [s.path for s in remote.shards] == [server.url(n) for n in SPLIT]
    assert _snapshot(remote) == _snapshot(local)
    assert len(remote.shards) == 3 and len(remote.tensors) == 6
    asked = {r.path for r in server.log}
    assert asked == {f"/files/{n}" for n in SPLIT}, server.log


def test_any_shard_url_opens_the_whole_model(files: Path, server: RangeServer) -> None:
    m = open_model(server.url(SPLIT[1]))
    assert [s.path for s in m.shards] == [server.url(n) for n in SPLIT]
    assert _snapshot(m) == _snapshot(open_model(files / SPLIT[0]))


def test_split_url_with_query_keeps_the_query_on_every_shard(server: RangeServer) -> None:
    m = open_model(server.url(SPLIT[0]) + "?download=true")
    assert [s.path for s in m.shards] == [server.url(n) + "?download=true" for n in SPLIT]


def test_missing_shard_url_names_the_missing_url(files: Path, tmp_path: Path) -> None:
    for name in (SPLIT[0], SPLIT[2]):
        shutil.copy(files / name, tmp_path / name)
    with RangeServer(tmp_path) as srv, pytest.raises(GGUFError) as ei:
        open_model(srv.url(SPLIT[0]))
    assert srv.url(SPLIT[1]) in str(ei.value)
    assert "404" in str(ei.value)


# --- redirects and tokens ---------------------------------------------------------------------


def test_redirect_is_followed_with_the_range_header(files: Path, server: RangeServer) -> None:
    m = open_model(server.resolve_url(BIG))
    assert _snapshot(m) == _snapshot(open_model(files / BIG))
    log = server.log
    assert [r.status for r in log[:2]] == [302, 206]
    served = [r for r in log if r.path.startswith("/files/")]
    assert served and all(r.status == 206 and "Range" in r.headers for r in served)
    assert server.bytes_sent() < (files / BIG).stat().st_size / 8


def test_later_requests_go_straight_to_the_redirect_target(server: RangeServer) -> None:
    with HttpRangeSource(server.resolve_url(BIG)) as src:
        assert src.final_url == server.url(BIG)
        src.read(0, 3 * BLOCK_SIZE)
    assert [r.status for r in server.log] == [302, 206, 206]


def test_token_is_sent_to_the_original_host_only(
    files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with RangeServer(files, redirect_host="localhost", tls=True) as srv:  # same server, another host name
        _token_for(monkeypatch, srv, "hf_secret")
        with HttpRangeSource(srv.resolve_url(BIG)) as src:
            src.read(0, 3 * BLOCK_SIZE)
        log = srv.log
    first, rest = log[0], log[1:]
    assert first.status == 302 and first.headers.get("Authorization") == "Bearer hf_secret"
    assert rest and all(r.status == 206 for r in rest)
    assert all("Authorization" not in r.headers for r in rest)
    assert all(r.headers.get("Host", "").startswith("localhost:") for r in rest)


def test_token_is_kept_on_a_same_host_redirect(
    files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with RangeServer(files, require_token="hf_secret", tls=True) as srv:
        _token_for(monkeypatch, srv, "hf_secret")
        m = open_model(srv.resolve_url(BIG))
        log = srv.log
    assert len(m.tensors) == 7
    assert all(r.headers.get("Authorization") == "Bearer hf_secret" for r in log)
    assert all("offload-planner" in r.headers.get("User-Agent", "") for r in log)


def test_gated_model_without_token_says_set_hf_token(files: Path) -> None:
    with RangeServer(files, require_token="hf_secret") as srv, pytest.raises(GGUFError) as ei:
        open_model(srv.url(BIG))
    msg = str(ei.value)
    assert srv.url(BIG) in msg and "HF_TOKEN" in msg and "401" in msg


def test_gated_model_with_a_wrong_token(files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with RangeServer(files, require_token="hf_secret", tls=True) as srv, pytest.raises(GGUFError) as ei:
        _token_for(monkeypatch, srv, "hf_wrong")
        open_model(srv.url(BIG))
    msg = str(ei.value)
    assert srv.url(BIG) in msg and "403" in msg and "hf_wrong" not in msg


def test_token_is_not_sent_to_a_host_that_is_not_hugging_face(
    files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    with RangeServer(files, require_token="hf_secret") as srv, pytest.raises(GGUFError) as ei:
        open_model(srv.url(BIG))
    assert all("Authorization" not in r.headers for r in srv.log)
    assert "only over https to Hugging Face hosts" in str(ei.value) and "hf_secret" not in str(ei.value)


def test_token_origins_are_https_and_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    from offload_planner.core.remote import _is_token_origin

    assert _is_token_origin("https://huggingface.co/org/m/resolve/main/x.gguf")
    assert _is_token_origin("https://huggingface.co:443/x") and _is_token_origin("https://hf.co/x")
    assert not _is_token_origin("http://huggingface.co/x"), "never over plain http"
    assert not _is_token_origin("https://huggingface.co:8443/x"), "another port is another origin"
    assert not _is_token_origin("https://cdn-lfs.huggingface.co/x") and not _is_token_origin("https://evilhuggingface.co/x")
    monkeypatch.setenv("HF_ENDPOINT", "https://hf-mirror.com")
    assert _is_token_origin("https://hf-mirror.com/x") and not _is_token_origin("https://hf-mirror.com:444/x")
    monkeypatch.setenv("HF_ENDPOINT", "http://hf-mirror.com")
    assert not _is_token_origin("http://hf-mirror.com/x"), "an http endpoint gets no token"


def test_explicit_authorization_header_is_dropped_on_a_cross_host_redirect(
    files: Path,
) -> None:
    with RangeServer(files, redirect_host="localhost") as srv:
        with HttpRangeSource(srv.resolve_url(BIG), headers={"Authorization": "Bearer x"}):
            pass
        log = srv.log
    assert log[0].headers.get("Authorization") == "Bearer x"
    assert [r.status for r in log] == [302, 206] and "Authorization" not in log[1].headers


def test_headers_argument_is_sent(server: RangeServer) -> None:
    with HttpRangeSource(server.url(BIG), headers={"X-Test": "yes"}):
        pass
    assert server.log[0].headers.get("X-Test") == "yes"


# --- servers without Range support ------------------------------------------------------------


def test_server_without_range_support_streams_only_the_header(files: Path) -> None:
    size = (files / BIG).stat().st_size
    with RangeServer(files, ranges=False) as srv:
        with HttpRangeSource(srv.url(BIG)) as src:
            header = read_header(src)
            assert src.size == size
            assert src.request_count == 1  # one stream, read on as the header grows
            assert src.bytes_fetched <= 2 * header.data_offset < size / 8
        m = open_model(srv.url(BIG))
        _wait_for_log(srv, 2)
        log = srv.log
    assert _snapshot(m) == _snapshot(open_model(files / BIG))
    assert all(r.status == 200 for r in log)
    assert all(r.bytes_sent < size for r in log)  # the download was abandoned


def test_server_that_stops_honouring_range_is_read_as_a_stream(files: Path) -> None:
    data = (files / BIG).read_bytes()
    with RangeServer(files) as srv, HttpRangeSource(srv.url(BIG)) as src:
        srv.config.ranges = False  # after the probe: the next request gets 200 and the whole body
        assert src.read(BLOCK_SIZE + 3, 100) == data[BLOCK_SIZE + 3 : BLOCK_SIZE + 103]
        assert src.read(5, 10) == data[5:15]
        assert src.request_count == 2 and src.bytes_fetched == 3 * BLOCK_SIZE


def test_server_without_range_or_content_length_is_an_error(files: Path) -> None:
    with RangeServer(files, ranges=False, content_length=False) as srv:
        with pytest.raises(GGUFError, match="Content-Length") as ei:
            open_model(srv.url(BIG))
        assert srv.url(BIG) in str(ei.value)


# --- errors ---------------------------------------------------------------------------------


def test_404_names_the_url(server: RangeServer) -> None:
    url = server.url("nope.gguf")
    with pytest.raises(GGUFError, match="404") as ei:
        open_model(url)
    assert ei.value.path == url and url in str(ei.value)


def test_connection_refused_names_the_url() -> None:
    url = f"http://127.0.0.1:{_free_port()}/files/model.gguf"
    with pytest.raises(GGUFError, match="refused") as ei:
        open_model(url)
    assert ei.value.path == url


def test_timeout_is_an_error(files: Path) -> None:
    with RangeServer(files, stall=True) as srv:
        url = srv.url(BIG)
        t0 = time.monotonic()
        with pytest.raises(GGUFError, match="timed out") as ei:
            HttpRangeSource(url, timeout=0.3)
        assert time.monotonic() - t0 < 5
    assert ei.value.path == url


def test_empty_remote_file_is_a_gguf_error(server: RangeServer) -> None:
    url = server.url("empty.gguf")
    with pytest.raises(GGUFError, match="ends inside the header") as ei:
        open_model(url)
    assert ei.value.path == url and ei.value.offset == 0


def test_bad_urls_are_gguf_errors() -> None:
    for url in ("http://", "http://127.0.0.1:99999/x.gguf", "https://[::1/x.gguf"):
        with pytest.raises(GGUFError) as ei:
            HttpRangeSource(url, timeout=2)
        assert ei.value.path == url


# --- hostile servers: trickling bodies, odd redirects, where the token goes ---------------------------


def test_a_server_that_trickles_bytes_hits_the_deadline(files: Path) -> None:
    """Headers at once, then one byte every 0.2 s: each wait is short, the whole read is not."""
    with RangeServer(files, drip=0.2) as srv:
        url = srv.url(BIG)
        t0 = time.monotonic()
        with pytest.raises(GGUFError, match=r"gave up after 1\.5 s on the network") as ei:
            HttpRangeSource(url, timeout=5, deadline=1.5)
        took = time.monotonic() - t0
    assert ei.value.path == url and url in str(ei.value)
    assert took < 4, f"{took:.1f} s"


def test_the_deadline_ends_inspect_on_the_command_line(files: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from offload_planner import cli

    monkeypatch.setattr("offload_planner.core.remote.DEFAULT_DEADLINE", 1.0)
    with RangeServer(files, drip=0.2) as srv:
        t0 = time.monotonic()
        assert cli.main(["inspect", srv.url(BIG)]) == 2
        assert time.monotonic() - t0 < 4
    err = capsys.readouterr().err
    assert srv.url(BIG) in err and "gave up after 1 s" in err


def test_a_stalled_server_is_bounded_by_the_deadline_too(files: Path) -> None:
    with RangeServer(files, stall=True) as srv:
        t0 = time.monotonic()
        with pytest.raises(GGUFError, match=r"gave up after 0\.5 s"):
            HttpRangeSource(srv.url(BIG), timeout=30, deadline=0.5)
        assert time.monotonic() - t0 < 3


def test_a_redirect_to_ftp_is_not_followed(files: Path) -> None:
    with RangeServer(files, redirect_to="ftp://127.0.0.1/model.gguf") as srv:
        url = srv.resolve_url(BIG)
        with pytest.raises(GGUFError, match="only http and https are followed") as ei:
            HttpRangeSource(url)
    assert ei.value.path == url and "ftp://127.0.0.1/model.gguf" in str(ei.value)


def test_no_downgrade_from_https_to_http_with_a_token(files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with RangeServer(files) as plain, RangeServer(files, redirect_to=plain.url(BIG), tls=True) as srv:
        _token_for(monkeypatch, srv, "hf_secret")
        with pytest.raises(GGUFError, match="from https to plain http"):
            HttpRangeSource(srv.resolve_url(BIG))
        assert srv.log[0].headers.get("Authorization") == "Bearer hf_secret"
    assert plain.log == [], "nothing went to the plain http server"


def test_token_is_not_sent_over_plain_http_even_to_the_endpoint(
    files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with RangeServer(files, require_token="hf_secret") as srv, pytest.raises(GGUFError, match="401"):
        monkeypatch.setenv("HF_TOKEN", "hf_secret")
        monkeypatch.setenv("HF_ENDPOINT", srv.base)  # http://: a token would travel in clear text
        open_model(srv.url(BIG))
    assert srv.log and all("Authorization" not in r.headers for r in srv.log)


def test_token_is_not_sent_to_another_port_of_the_endpoint_host(
    files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with RangeServer(files, tls=True) as endpoint, RangeServer(files, tls=True) as other:
        _token_for(monkeypatch, endpoint, "hf_secret")
        with HttpRangeSource(other.url(BIG)):
            pass
        with HttpRangeSource(endpoint.url(BIG)):
            pass
    assert other.log and all("Authorization" not in r.headers for r in other.log)
    assert endpoint.log[0].headers.get("Authorization") == "Bearer hf_secret"


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_a_server_that_trickles_its_headers_hits_the_deadline(
    files: Path, monkeypatch: pytest.MonkeyPatch, tls: bool
) -> None:
    """Every wait for a header byte is short (0.1 s): only the overall deadline ends it."""
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_cert_file()))
    with RangeServer(files, drip_headers=0.1, tls=tls) as srv:
        t0 = time.monotonic()
        with pytest.raises(GGUFError, match=r"gave up after 1\.5 s on the network") as ei:
            HttpRangeSource(srv.url(BIG), timeout=5, deadline=1.5)
        took = time.monotonic() - t0
    assert srv.url(BIG) in str(ei.value) and took < 4, f"{took:.1f} s"
