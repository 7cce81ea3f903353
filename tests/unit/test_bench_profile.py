"""benchmarks/profile.py: a sampled stack goes to the stage of its innermost known frame,
and py-spy's raw output is counted per stage and per chain of the gateway's frames."""

from __future__ import annotations

from benchmarks.profile import breakdown, innermost, native_leaves, stage_of, table

RECEIVE = (
    "_run_once (asyncio/base_events.py:1922);_on_readable (kernel_gateway_stream/kernels/"
    "zmq_kernel.py:611);_read (kernel_gateway_stream/kernels/zmq_kernel.py:620);_pull "
    "(kernel_gateway_stream/kernels/zmq_kernel.py:682);_receive "
    "(kernel_gateway_stream/kernels/zmq_kernel.py:922)"
)
SIGN = (
    "_read (kernel_gateway_stream/kernels/zmq_kernel.py:640);_verified "
    "(kernel_gateway_stream/kernels/zmq_kernel.py:745);Signer.verify (kernel_gateway_stream/core/"
    "messages.py:306);Signer.sign (kernel_gateway_stream/core/messages.py:297)"
)
WRITER = "run (threading.py:975);_loop (kernel_gateway_stream/stores/sqlite_writer.py:200)"


def test_the_innermost_known_frame_decides() -> None:
    assert stage_of(RECEIVE) == "ZMQ receive"
    assert stage_of(SIGN) == "HMAC and replay check"
    assert stage_of(WRITER) == "SQLite writer thread"
    assert stage_of("main (somewhere.py:1)") == "other"
    assign = "Sequencer.assign (kernel_gateway_stream/core/sequencer.py:30)"
    assert stage_of(assign) == "record building"


def test_raw_output_is_counted_per_stage_and_per_chain() -> None:
    raw = f"{RECEIVE} 30\n{SIGN} 10\n{WRITER} 10\nnot a sample line\n"
    counts = breakdown(raw)
    assert counts == {"ZMQ receive": 30, "HMAC and replay check": 10, "SQLite writer thread": 10}
    chains = innermost(raw, 2)
    assert chains.most_common(1)[0][1] == 30
    assert next(iter(chains)).startswith("_receive (")
    rendered = table(counts, 100.0)
    assert "| ZMQ receive | 60.0 | 60 % |" in rendered
    assert "**100.0**" in rendered


def test_native_samples_are_counted_per_c_function_and_its_python_caller() -> None:
    publish = (
        "_record (kernel_gateway_stream/recording/recorder.py:564);MemoryBroker.publish "
        "(kernel_gateway_stream/broker/memory.py:83);_asyncio_get_running_loop "
        "(_asynciomodule.c.h:747);get_running_loop (_asynciomodule.c:274);getpid (libc.so.6)"
    )
    raw = f"{publish} 20\n{RECEIVE} 5\n{publish} 4\n"
    leaves = native_leaves(raw)
    assert leaves == {
        "getpid ← MemoryBroker.publish (kernel_gateway_stream/broker/memory.py:83)": 24
    }
    assert stage_of(publish) == "fan-out and subscribers"
