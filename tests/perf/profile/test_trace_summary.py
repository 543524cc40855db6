"""The profiler trace summary: GPU time by category, idle share, top kernels and host syncs per step, on traces
written here in the shape torch.profiler exports on a GPU (its kernels' real names), and on a real CPU trace."""

from __future__ import annotations

import json

import pytest
import torch

from dlscale.perf.profile.trace_summary import (
    kernel_category,
    short_kernel_name,
    summarize_trace,
)

# Kernel names as torch 2.x traces on Hopper and Ampere GPUs show them.
NAMES = {
    "matmul": [
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"
        "_kernel__5x_cublas",
        "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT",
        "ampere_sgemm_32x32_sliced1x4_nn",
        "triton_tem_fused_addmm_0",
    ],
    "attention": [
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 64, 4, false, false, "
        "cutlass::bfloat16_t>, false, false, false, false, true, true, false>(Flash_fwd_params)",
        "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, "
        "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
        "cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x128_4x1x1_kernel0_0",
    ],
    "optimizer": [
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
        "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
        "(at::native::ADAM_MODE)0, false>, float*, double, double>(...)",
    ],
    "communication": ["ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"],
    "elementwise": [
        "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&,"
        " at::native::GeluType)::{lambda()#2}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>"
        " >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::"
        "operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>)",
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float,"
        " c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)",
        "triton_poi_fused_add_mul_0",
        "triton_red_fused_native_layer_norm_1",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
        "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}"
        ">, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, ...>)",
    ],
}


@pytest.mark.parametrize(("category", "name"), [(c, n) for c, names in NAMES.items() for n in names])
def test_kernel_names_fall_into_their_category(category: str, name: str) -> None:
    assert kernel_category(name) == category


def test_short_names_keep_the_kernel_and_its_first_template_level() -> None:
    name = NAMES["optimizer"][0]
    short = short_kernel_name(name)
    assert (
        short
        == "at::native::multi_tensor_apply_kernel<TensorListMetadata, FusedAdamMathFunctor, float*, double, double>"
    )
    assert short_kernel_name("triton_poi_fused_add_mul_0") == "triton_poi_fused_add_mul_0"
    assert len(short_kernel_name("x" * 300, limit=50)) == 50


def span(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}


def gpu_trace() -> dict:
    """Two recorded steps of 1000 us each on thread 1. GPU: a 400 us GEMM, a 200 us attention kernel, a 100 us
    GELU and a 50 us fused Adam per step, a 50 us copy at the start; the GPU idles 200 us between the steps.
    Step 7 reads its loss (a stream sync) and step 8 does not; a loader thread syncs once."""
    events = [
        span("user_annotation", "ProfilerStep#7", 0, 1000),
        span("user_annotation", "ProfilerStep#8", 1000, 1000),
        span("gpu_user_annotation", "ProfilerStep#7", 0, 1000, tid=7),  # GPU-side copy of the range: ignored
        span("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 0, 50, tid=8),
        span("cuda_runtime", "cudaLaunchKernel", 10, 5),
        span("cuda_runtime", "cudaStreamSynchronize", 900, 20),
        span("cuda_runtime", "cudaEventSynchronize", 950, 5, tid=2),  # a loader thread
        span("cuda_runtime", "cudaMemcpyAsync", 1500, 5),  # asynchronous: not a host sync
        span("cpu_op", "aten::item", 890, 40),
    ]
    for start in (50, 1250):
        events += [
            span("kernel", NAMES["matmul"][0], start, 400, tid=7),
            span("kernel", NAMES["attention"][0], start + 400, 200, tid=7),
            span("kernel", NAMES["elementwise"][0], start + 600, 100, tid=7),
            span("kernel", NAMES["optimizer"][0], start + 700, 50, tid=7),
        ]
    return {"traceEvents": events}


def test_gpu_time_shares_idle_and_top_kernels() -> None:
    summary = summarize_trace(gpu_trace(), first_step=100)
    assert summary.on_gpu and summary.steps == 2 and summary.device_events == 9
    assert summary.window_ms == pytest.approx(2.0)  # 0 to 2000 us
    assert summary.busy_ms == pytest.approx(1.55)  # 50 + 2 x 750
    assert summary.idle_share == pytest.approx(1 - 1.55 / 2.0)
    assert summary.category_ms == pytest.approx(
        {
            "matmul": 0.8,
            "attention": 0.4,
            "elementwise": 0.2,
            "optimizer": 0.1,
            "copy": 0.05,
            "communication": 0,
        }
    )
    assert sum(summary.category_share.values()) == pytest.approx(1.0)
    assert summary.category_share["matmul"] == pytest.approx(0.8 / 1.55)
    top = summary.top_kernels
    assert [k["category"] for k in top] == ["matmul", "attention", "elementwise", "optimizer", "copy"]
    assert top[0]["count"] == 2 and top[0]["ms"] == pytest.approx(0.8)


def test_host_syncs_are_counted_per_step_on_the_loop_thread() -> None:
    summary = summarize_trace(gpu_trace(), first_step=100)
    assert [(s.step, s.host_syncs) for s in summary.step_syncs] == [(107, 1), (108, 0)]
    assert summary.step_syncs[0].calls == {"cudaStreamSynchronize": 1}
    assert summary.host_syncs_per_step() == [1, 0]
    assert summary.other_syncs == 1  # the loader thread's, not the loop's
    document = json.loads(json.dumps(summary.to_json()))
    assert document["host_syncs_per_step"] == [1, 0] and document["category_share"]["matmul"] > 0.5
    lines = summary.lines()
    assert lines[0].startswith("GPU time over 2 profiled step(s) (2.0 ms, busy 1.6 ms): matmul 52%")
    assert "idle 22.5% of the window" in lines[0]
    assert lines[1] == (
        "Host syncs per step (training thread): 1, 0 (cudaStreamSynchronize); 1 outside them (other threads)"
    )


@pytest.mark.parametrize(
    "name",
    [
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cuStreamSynchronize",
        "cudaMemcpy2D_v3020",
    ],
)
def test_every_blocking_call_is_a_host_sync(name: str) -> None:
    trace = gpu_trace()
    trace["traceEvents"].append(span("cuda_runtime", name, 1100, 3))
    assert summarize_trace(trace).host_syncs_per_step() == [1, 1]


def test_overlapping_streams_are_busy_once() -> None:
    trace = {
        "traceEvents": [
            span("user_annotation", "ProfilerStep#0", 0, 100),
            span("kernel", "ampere_sgemm_64x64_nn", 0, 100, tid=7),
            span("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 50, 100, tid=8),  # on a side stream
        ]
    }
    summary = summarize_trace(trace)
    assert summary.busy_ms == pytest.approx(0.15) and summary.window_ms == pytest.approx(0.15)
    assert summary.idle_share == pytest.approx(0.0)


def test_a_real_cpu_trace_has_no_gpu_numbers(tmp_path) -> None:
    def write(profiler: torch.profiler.profile) -> None:
        profiler.export_chrome_trace(str(tmp_path / "trace.json"))

    model = torch.nn.Linear(16, 16)
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1)
    with torch.profiler.profile(schedule=schedule, on_trace_ready=write) as profiler:
        for _ in range(3):
            model(torch.randn(4, 16)).sum().backward()
            profiler.step()
    summary = summarize_trace(json.loads((tmp_path / "trace.json").read_text()))
    assert summary.steps == 2 and not summary.on_gpu
    assert summary.idle_share is None and summary.step_syncs == [] and summary.top_kernels == []
    assert summary.lines() == [
        "No GPU activity in the trace (2 step(s)): no GPU time shares or host syncs to count"
    ]
