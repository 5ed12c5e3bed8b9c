"""Forked workers and graph-strict mode on a machine without a GPU."""

import multiprocessing as mp

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import layerzero as lz  # noqa: E402


def _child_norm(queue):
    try:
        x = torch.randn(512, 1024)
        w = torch.randn(1024)
        got = lz.ops.rms_norm(x, w)
        q = torch.randn(2, 128, 8, 64)
        att = lz.ops.attention(q, q, q, causal=True)
        ok = torch.allclose(got, F.rms_norm(x, (1024,), w, eps=1e-6), atol=1e-5) and att.shape == q.shape
        queue.put(("ok" if ok else "wrong", lz.which("rms_norm", x=x, weight=w)))
    except Exception as e:  # noqa: BLE001 - reported to the parent
        queue.put(("error", repr(e)))


def test_a_forked_child_runs_ops_after_the_parent_used_the_pool():
    # The parent runs parallel kernels first, so rayon's pool exists with its threads.
    x = torch.randn(512, 1024)
    for _ in range(3):
        lz.ops.rms_norm(x, torch.ones(1024))
        lz.ops.attention(torch.randn(2, 128, 8, 64), torch.randn(2, 128, 8, 64), torch.randn(2, 128, 8, 64))
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_norm, args=(queue,))
    child.start()
    child.join(timeout=120)
    if child.is_alive():
        child.kill()
        pytest.fail("the forked child hung")
    status, detail = queue.get(timeout=5)
    assert status == "ok", detail
    assert child.exitcode == 0
    # The parent still works after the fork.
    assert lz.ops.rms_norm(x, torch.ones(1024)).shape == x.shape


def test_graph_safe_mode_refuses_ops_with_no_graph_safe_kernel_naming_the_op():
    q = torch.randn(1, 8, 2, 16)
    with lz.graph_safe():
        with pytest.raises(lz.NoKernelError, match="attention") as e:
            lz.ops.attention(q, q, q)
        assert "GRAPH_UNSAFE" in {r.code.name for r in e.value.reasons}
    # Outside the context, the same call runs.
    assert lz.ops.attention(q, q, q).shape == q.shape


def test_graph_safe_selection_on_an_h100_keeps_graph_safe_kernels_only():
    class D:
        def __init__(self, shape):
            self.shape, self.dtype, self.device = shape, "torch.bfloat16", "cuda:0"

        def stride(self):
            s, out = 1, []
            for d in reversed(self.shape):
                out.append(s)
                s *= d
            return tuple(reversed(out))

    planning = lz.LayerZero.planning("h100")
    q = D((1, 512, 32, 128))
    k = D((1, 512, 8, 128))
    strict = lz._lz.graph_strict(planning)
    report = strict.explain("attention", q=q, k=k, v=k, causal=True)
    assert report.selected is not None
    for c in report.candidates:
        if c.verdict in ("selected", "eligible"):
            continue
        assert c.reasons
    # Every kernel the strict handle admits is declared graph-safe: none was refused for it.
    admitted = [c.kernel for c in report.candidates if c.verdict in ("selected", "eligible")]
    loose = planning.explain("attention", q=q, k=k, v=k, causal=True)
    unsafe = [
        c.kernel for c in report.candidates if "GRAPH_UNSAFE" in {r.code.name for r in c.reasons}
    ]
    assert unsafe, "graph-strict mode refused no kernel for being graph-unsafe"
    assert set(admitted).isdisjoint(unsafe)
    assert loose.selected is not None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a GPU; none on this machine")
def test_a_decoder_step_captured_on_a_side_stream_replays_equal_to_eager():
    q = torch.randn(1, 1, 8, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 64, 8, 64, device="cuda", dtype=torch.bfloat16)
    eager = lz.ops.attention(q, k, k, causal=True)
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with lz.graph_safe(), torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = lz.ops.attention(q, k, k, causal=True)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, eager)
