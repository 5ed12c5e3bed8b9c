"""The front door in Python: select, explain and which over torch tensors, reports as
objects with reason codes as enum members, errors as exceptions that name the argument."""

import json
import threading

import pytest
import torch

import layerzero as lz


def gqa(seq=128, heads=8, kv_heads=2, head_dim=64, dtype=torch.float32):
    q = torch.randn(1, seq, heads, head_dim, dtype=dtype)
    k = torch.randn(1, seq, kv_heads, head_dim, dtype=dtype)
    v = torch.randn(1, seq, kv_heads, head_dim, dtype=dtype)
    return q, k, v


def test_a_cpu_attention_call_selects_a_cpu_kernel_and_says_where_the_choice_came_from():
    q, k, v = gqa()
    s = lz.select("attention", q=q, k=k, v=v, causal=True)
    assert s.backend in ("cpu", "onednn", "cpu_reference")
    assert s.kernel.startswith(s.backend + ".attention.")
    assert s.source in ("plan", "cache", "live")
    assert s.total_ns > 0 and s.candidates >= s.rejected + 1
    assert lz.which("attention", q=q, k=k, v=v, causal=True) == s.kernel


def test_explain_names_every_candidate_and_each_rejection_has_an_enum_code():
    q, k, v = gqa()
    # Dropout (which torch SDPA's math kernel has) with a soft-cap (which it has not): no kernel.
    report = lz.explain("attention", q=q, k=k, v=v, causal=True, dropout_p=0.1, softcap=30.0)
    assert report.selected is None
    names = [c.kernel for c in report.candidates]
    assert "flash_attn_3.attention.fwd" in names and "cpu.attention.flash" in names
    cpu = report.candidate("cpu.attention.flash")
    assert cpu.verdict == "rejected"
    assert lz.ReasonCode.DROPOUT_UNSUPPORTED in [r.code for r in cpu.reasons]
    assert all(isinstance(r.code, lz.ReasonCode) for c in report.candidates for r in c.reasons)
    as_json = json.loads(report.to_json())
    assert as_json["selected"] is None and len(as_json["candidates"]) == len(names)


def test_a_named_machine_is_planned_for_from_this_one():
    h100 = lz.LayerZero.planning("h100")
    assert h100.hardware == "h100"
    q, k, v = gqa(dtype=torch.bfloat16)
    report = h100.explain("attention", q=q, k=k, v=v, causal=True, dropout_p=0.1)
    fa3 = report.candidate("flash_attn_3.attention.fwd")
    assert lz.ReasonCode.DROPOUT_UNSUPPORTED in [r.code for r in fa3.reasons]


def test_sdpa_order_is_taken_with_layout_bhsd():
    q, k, v = gqa()
    bshd = lz.explain("attention", q=q, k=k, v=v)
    bhsd = lz.explain("attention", q=q.transpose(1, 2), k=k.transpose(1, 2), v=v.transpose(1, 2), layout="BHSD")
    assert bshd.selected is not None and bhsd.selected is not None
    assert json.loads(bhsd.to_json())["request"]["tensors"]["q"]["layout"] == "BHSD"


def test_a_bad_attribute_is_an_invalid_input_error_naming_the_field_and_value():
    q, k, v = gqa()
    with pytest.raises(lz.InvalidInputError, match="attrs.causal") as e:
        lz.select("attention", q=q, k=k, v=v, causal="yes")
    assert "yes" in str(e.value)
    assert isinstance(e.value, lz.LayerZeroError)


def test_an_unsupported_dtype_names_the_tensor_and_the_dtype():
    q, k, v = gqa()
    with pytest.raises(lz.InvalidInputError, match="tensor `q`.*float64"):
        lz.select("attention", q=q.double(), k=k, v=v)


def test_a_non_tensor_names_the_argument():
    with pytest.raises(lz.InvalidInputError, match="argument `weight`"):
        lz.select("rms_norm", x=torch.zeros(4, 64), weight=object())


def test_an_unknown_op_lists_the_ops():
    with pytest.raises(lz.InvalidInputError, match="unknown op \"attn\""):
        lz.select("attn", x=torch.zeros(4))


def test_no_kernel_is_an_error_carrying_every_reason():
    q, k, v = gqa()
    with pytest.raises(lz.NoKernelError) as e:
        lz.select("attention", q=q, k=k, v=v, dropout_p=0.5, softcap=30.0)
    codes = [r.code for r in e.value.reasons]
    assert lz.ReasonCode.DROPOUT_UNSUPPORTED in codes
    assert all(isinstance(r.message, str) and r.message for r in e.value.reasons)


def test_an_unknown_machine_is_its_own_error():
    with pytest.raises(lz.UnknownHardwareError, match="h9000"):
        lz.LayerZero.planning("h9000")


def test_a_builder_consumes_the_handle_it_is_called_on(tmp_path):
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"rules": [{"action": "deny", "kernels": "cpu.*"}]}))
    first = lz.LayerZero.planning("spr")
    second = first.with_policy(policy)
    x, w = torch.zeros(4, 64), torch.ones(64)
    assert not second.which("rms_norm", x=x, weight=w).startswith("cpu.")
    with pytest.raises(lz.LayerZeroError, match="consumed"):
        first.which("rms_norm", x=x, weight=w)


def test_counters_count_the_process_wide_handle_s_selections():
    x, w = torch.zeros(4, 64), torch.ones(64)
    before = lz.counters()
    for _ in range(3):
        lz.select("rms_norm", x=x, weight=w)
    after = lz.counters()
    served = lambda c: c["live"] + c["cache_hits"] + c["plan_hits"]  # noqa: E731
    assert served(after) - served(before) == 3


def test_threads_share_one_handle():
    x, w = torch.zeros(4, 64), torch.ones(64)
    h = lz.LayerZero.detected()
    seen, errors = [], []

    def work():
        try:
            for _ in range(50):
                seen.append(h.which("rms_norm", x=x, weight=w))
        except Exception as e:  # noqa: BLE001 - the test reports whatever went wrong
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(seen)) == 1 and len(seen) == 200


def test_doctor_and_readiness_report_this_machine():
    report = lz.doctor()
    assert {"hardware", "backends", "knobs"} <= set(report)
    assert any(k["name"] == "LAYERZERO_CPU_ISA" for k in report["knobs"])
    checks = lz.readiness_check()
    assert {c["name"] for c in checks} >= {"capabilities", "schemas", "perfdb"}
    assert all(isinstance(c["ok"], bool) for c in checks)


def test_every_reason_code_is_an_enum_member_with_its_own_name():
    names = [name for name, _ in lz._lz.reason_codes()]
    assert len(names) == len(set(names)) == len(lz.ReasonCode)
    assert lz.ReasonCode["HEAD_DIM_UNSUPPORTED"].value == "HEAD_DIM_UNSUPPORTED"
