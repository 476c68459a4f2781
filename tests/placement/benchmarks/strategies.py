from __future__ import annotations

from hypothesis import strategies as st

from fleet.placement.benchmarks.trace import TraceNode, TracePod

MODELS = ("A", "B")


@st.composite
def nodes(draw: st.DrawFn) -> tuple[TraceNode, ...]:
    count = draw(st.integers(1, 6))
    return tuple(
        TraceNode(
            name=f"n{i}",
            cpu_milli=draw(st.sampled_from([4000, 16000, 64000])),
            memory_mib=draw(st.sampled_from([16384, 65536])),
            gpu_count=draw(st.integers(0, 4)),
            model=draw(st.sampled_from(MODELS)),
        )
        for i in range(count)
    )


@st.composite
def pods(draw: st.DrawFn) -> tuple[TracePod, ...]:
    count = draw(st.integers(1, 40))
    out = []
    for i in range(count):
        num_gpu = draw(st.sampled_from([0, 1, 1, 1, 2, 4]))
        milli = draw(st.sampled_from([100, 250, 500, 810, 1000])) if num_gpu == 1 else 1000
        out.append(
            TracePod(
                name=f"p{i}",
                cpu_milli=draw(st.sampled_from([1000, 4000, 12000])),
                memory_mib=draw(st.sampled_from([1024, 8192, 32768])),
                num_gpu=num_gpu,
                gpu_milli=milli if num_gpu else 0,
                gpu_spec=draw(st.sampled_from([(), ("A",), ("B",)])) if num_gpu else (),
            )
        )
    return tuple(out)
