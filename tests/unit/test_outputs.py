"""Cell outputs rebuilt from records (``GET .../cells``): folded as JupyterLab's output
area folds them, the latest execution of each cell, bounded."""

from __future__ import annotations

import json
from typing import Any

from helpers import make_message, make_parts, record, status, stream
from hypothesis import given
from hypothesis import strategies as st

from kernel_gateway_stream.core.marks import gap_record, lifecycle_status, request_mark
from kernel_gateway_stream.core.messages import KernelMessage, Record
from kernel_gateway_stream.core.outputs import CellRestorer, StreamText, cell_request, fold_text


def test_fold_text_as_a_terminal_does() -> None:
    assert fold_text("a\nb\n") == "a\nb\n"
    assert fold_text("10%\r20%\r30%") == "30%"
    assert fold_text("10%\r20%\r") == "20%\r", "a trailing CR waits to overwrite its line"
    assert fold_text("long line\rshort") == "shortline", "a longer earlier part shows past it"
    assert fold_text("a\r\nb") == "a\nb", "CR LF is a newline"
    assert fold_text("abc\b\bd") == "ad"
    assert fold_text("x\n\by") == "x\n\by", "a backspace never removes a newline"
    assert fold_text("one\rtwo\nthree\rfour\n") == "two\nfoure\n"


def _by_steps(pieces: list[str]) -> str:
    stream = StreamText(10**9)
    for piece in pieces:
        stream.add(piece)
    return stream.text()


@given(st.lists(st.text(alphabet="ab\r\n\b", max_size=8), max_size=12))
def test_folding_as_it_grows_is_what_jupyterlab_shows(pieces: list[str]) -> None:
    """JupyterLab's output model merges each stream message into the previous text and
    folds the whole again; folding only the last line as it grows shows the same."""
    shown = ""
    for piece in pieces:
        shown = fold_text(shown + piece)
    assert _by_steps(pieces) == shown


def test_a_hundred_thousand_progress_updates_cost_the_last_one() -> None:
    stream = StreamText(1024)
    for i in range(100_000):
        stream.add(f"\rprogress {i}")
    assert stream.text() == "progress 99999"
    assert stream.size < 64


def test_stream_text_keeps_the_tail_in_whole_lines_and_counts_what_it_left_out() -> None:
    stream = StreamText(100)
    for i in range(1000):
        stream.add(f"line {i}\n")
    text = stream.text()
    assert len(text) <= 100
    assert text.endswith("line 999\n")
    assert text.startswith("line "), "cut after a newline"
    assert stream.omitted == len("".join(f"line {i}\n" for i in range(1000))) - len(text)


def test_cell_request_reads_jupyterlab_cell_ids() -> None:
    parts = make_parts("execute_request", {"code": "1"}, metadata={"cellId": "cell-a"}, msg_id="m1")
    assert cell_request(parts) == ("m1", "cell-a")
    assert cell_request(make_parts("execute_request", {"code": "1"}, msg_id="m2")) is None
    assert cell_request(make_parts("execute_request", {}, metadata={"cellId": 3})) is None
    assert cell_request(make_parts("execute_request", {}, metadata={"cellId": "x" * 999})) is None
    assert cell_request([b"{", b"{}", b'{"cellId": "a"}', b"{}"]) is None


class Kernel:
    """Records of one kernel, numbered in order."""

    def __init__(self) -> None:
        self.records: list[Record] = []

    def add(self, message: KernelMessage) -> None:
        self.records.append(record(len(self.records) + 1, message))

    def request(self, msg_id: str, cell_id: str) -> None:
        self.add(request_mark(msg_id, cell_id, mark_id=f"r-{msg_id}", date="d", session="s"))

    def output(self, parent: str, msg_type: str, **content: Any) -> None:
        self.add(make_message(msg_type, content, parent))

    def run(self, msg_id: str, cell_id: str, count: int, *texts: str) -> None:
        self.request(msg_id, cell_id)
        self.add(status("busy", msg_id))
        self.output(msg_id, "execute_input", code="x", execution_count=count)
        for text in texts:
            self.add(stream("stdout", text, msg_id))
        self.add(status("idle", msg_id))

    def restore(self, **options: Any) -> list[dict[str, Any]]:
        restorer = CellRestorer(**options)
        restorer.feed(self.records)
        answer = restorer.result()
        json.dumps(answer)  # JSON-ready
        return answer


def test_the_latest_execution_of_each_cell_in_the_order_they_last_ran() -> None:
    kernel = Kernel()
    kernel.run("m1", "a", 1, "first\n")
    kernel.run("m2", "b", 2, "b\r", "bee\n")
    kernel.run("m3", "a", 3, "second\n")
    answer = kernel.restore()
    assert [(e["cell_id"], e["msg_id"], e["status"], e["execution_count"]) for e in answer] == [
        ("b", "m2", "ok", 2),
        ("a", "m3", "ok", 3),
    ]
    assert answer[1]["outputs"] == [{"output_type": "stream", "name": "stdout", "text": "second\n"}]
    assert answer[0]["outputs"][0]["text"] == "bee\n"


def test_outputs_of_every_kind_and_their_order() -> None:
    kernel = Kernel()
    kernel.request("m", "c")
    kernel.add(status("busy", "m"))
    kernel.output("m", "execute_input", code="x", execution_count=7)
    kernel.add(stream("stdout", "out 1\n", "m"))
    kernel.add(stream("stdout", "out 2\n", "m"))
    kernel.add(stream("stderr", "err\n", "m"))
    kernel.add(stream("stdout", "out 3\n", "m"))
    kernel.output(
        "m", "display_data", data={"text/plain": "d1"}, metadata={}, transient={"display_id": "D"}
    )
    kernel.output("m", "execute_result", data={"text/plain": "42"}, metadata={}, execution_count=7)
    kernel.output(
        "m",
        "update_display_data",
        data={"text/plain": "d2"},
        metadata={},
        transient={"display_id": "D"},
    )
    kernel.output("m", "error", ename="ValueError", evalue="bad", traceback=["tb"])
    kernel.add(status("idle", "m"))
    (execution,) = kernel.restore()
    assert execution["status"] == "error"
    assert execution["outputs"] == [
        {"output_type": "stream", "name": "stdout", "text": "out 1\nout 2\n"},
        {"output_type": "stream", "name": "stderr", "text": "err\n"},
        {"output_type": "stream", "name": "stdout", "text": "out 3\n"},
        {"output_type": "display_data", "data": {"text/plain": "d2"}, "metadata": {}},
        {
            "output_type": "execute_result",
            "data": {"text/plain": "42"},
            "metadata": {},
            "execution_count": 7,
        },
        {"output_type": "error", "ename": "ValueError", "evalue": "bad", "traceback": ["tb"]},
    ]
    assert execution["display_ids"] == {"D": [3]}


def test_clear_output_now_and_with_wait() -> None:
    kernel = Kernel()
    kernel.request("m", "c")
    kernel.output("m", "execute_input", code="x", execution_count=1)
    kernel.add(stream("stdout", "gone\n", "m"))
    kernel.output("m", "clear_output", wait=False)
    kernel.add(stream("stdout", "frame 1\n", "m"))
    kernel.output("m", "clear_output", wait=True)
    (execution,) = kernel.restore()
    assert execution["outputs"][0]["text"] == "frame 1\n", "wait: cleared when the next comes"
    kernel.add(stream("stdout", "frame 2\n", "m"))
    (execution,) = kernel.restore()
    assert execution["outputs"] == [
        {"output_type": "stream", "name": "stdout", "text": "frame 2\n"}
    ]
    assert execution["status"] == "running"


def test_a_display_updated_from_another_cell() -> None:
    kernel = Kernel()
    kernel.request("m1", "a")
    kernel.output(
        "m1", "display_data", data={"text/plain": "v1"}, metadata={}, transient={"display_id": "D"}
    )
    kernel.add(status("idle", "m1"))
    kernel.request("m2", "b")
    kernel.output(
        "m2",
        "update_display_data",
        data={"text/plain": "v2"},
        metadata={},
        transient={"display_id": "D"},
    )
    answer = kernel.restore()
    assert answer[0]["outputs"][0]["data"] == {"text/plain": "v2"}


def test_running_queued_died_and_gaps() -> None:
    kernel = Kernel()
    kernel.request("m1", "a")
    kernel.add(status("busy", "m1"))
    kernel.output("m1", "execute_input", code="x", execution_count=1)
    kernel.add(stream("stdout", "so far\n", "m1"))
    kernel.request("m2", "b")
    answer = kernel.restore()
    assert [e["status"] for e in answer] == ["running", "queued"]
    kernel.records.append(gap_record("k", 6, 6, "gateway_restart", now=0, date="d"))
    kernel.add(lifecycle_status("dead", "kernel_died", msg_id="x", date="d", session="s"))
    answer = kernel.restore()
    assert [(e["status"], e["reason"]) for e in answer] == [
        ("died", "kernel_died"),
        ("aborted", "kernel_died"),
    ]
    assert answer[0]["gaps"] == [{"first_seq": 6, "last_seq": 6}]


def test_an_execution_the_kernel_took_dies_with_it_before_its_execute_input() -> None:
    """Its busy recorded, its execute_input not (never sent: the kernel was killed first),
    then the kernel's end: died, as on the execute API, not aborted."""
    kernel = Kernel()
    kernel.request("m1", "a")
    kernel.add(status("busy", "m1"))
    kernel.add(lifecycle_status("restarting", "memory_limit", msg_id="x", date="d", session="s"))
    [answer] = kernel.restore()
    assert (answer["status"], answer["reason"]) == ("died", "memory_limit")


def test_since_answers_only_executions_with_newer_records_or_still_running() -> None:
    kernel = Kernel()
    kernel.run("m1", "a", 1, "a\n")
    done = len(kernel.records)
    kernel.run("m2", "b", 2, "b\n")
    kernel.request("m3", "c")
    restorer = CellRestorer()
    restorer.feed(kernel.records)
    assert [e["cell_id"] for e in restorer.result(since=done)] == ["b", "c"]
    assert restorer.head == len(kernel.records)


def test_bounded_by_outputs_per_execution_cells_and_bytes_in_all() -> None:
    kernel = Kernel()
    kernel.request("m", "c")
    for i in range(50):
        kernel.output("m", "display_data", data={"text/plain": "x" * 1000 + str(i)}, metadata={})
    (execution,) = kernel.restore(max_output_bytes=10_000)
    assert execution["truncated"]
    assert 5 <= len(execution["outputs"]) <= 10
    assert execution["outputs"][-1]["data"]["text/plain"].endswith("49")
    kernel = Kernel()
    for i in range(20):
        kernel.run(f"m{i}", f"c{i}", i, "y" * 1000 + "\n")
    answer = kernel.restore(max_cells=5)
    assert [e["cell_id"] for e in answer] == [f"c{i}" for i in range(15, 20)]
    restorer = CellRestorer()
    restorer.feed(kernel.records)
    answer = restorer.result(max_bytes=5_000)
    assert restorer.truncated
    assert [bool(e["outputs"]) for e in answer][-4:] == [True] * 4
    assert not answer[0]["outputs"]
    assert answer[0]["truncated"]


def test_an_execution_count_a_page_cannot_hold_is_none() -> None:
    kernel = Kernel()
    kernel.run("m1", "a", 2**60)
    kernel.request("m2", "b")
    kernel.output("m2", "execute_input", code="x", execution_count=True)
    kernel.output("m2", "execute_result", data={"text/plain": "1"}, metadata={}, execution_count=-1)
    first, second = kernel.restore()
    assert first["execution_count"] is None
    assert second["execution_count"] is None
    assert second["outputs"][0]["execution_count"] is None


def test_what_an_output_widget_captures_is_the_widgets_not_the_cells() -> None:
    """ipywidgets' ``with out: print(...)``: the kernel sets the widget's ``msg_id`` to the
    request, prints, then clears it; JupyterLab's output area hands that output to the
    widget (whose model the kernel keeps), so a restored cell must not show it again."""
    view = {"model_id": "w1", "version_major": 2, "version_minor": 0}
    kernel = Kernel()
    kernel.request("m1", "a")
    kernel.add(status("busy", "m1"))
    kernel.output("m1", "execute_input", code="x", execution_count=1)
    kernel.output("m1", "comm_open", comm_id="w1", target_name="jupyter.widget", data={
        "state": {"_model_name": "OutputModel", "msg_id": "", "outputs": []}})  # fmt: skip
    kernel.output("m1", "display_data", data={
        "text/plain": "Output()", "application/vnd.jupyter.widget-view+json": view})  # fmt: skip
    kernel.add(stream("stdout", "before\n", "m1"))
    # Another widget's traffic (a slider moved) changes nothing.
    kernel.output("m1", "comm_msg", comm_id="s1", data={"method": "update", "state": {"value": 3}})
    kernel.output(
        "m1", "comm_msg", comm_id="w1", data={"method": "update", "state": {"msg_id": "m1"}}
    )
    kernel.add(stream("stdout", "inside output\n", "m1"))
    kernel.output("m1", "error", ename="ValueError", evalue="shown in the widget", traceback=[])
    kernel.output(
        "m1", "comm_msg", comm_id="w1", data={"method": "update", "state": {"msg_id": ""}}
    )
    kernel.add(stream("stdout", "after\n", "m1"))
    kernel.add(status("idle", "m1"))
    # A capture the kernel never ended: the widget closed ends it.
    kernel.request("m2", "b")
    kernel.output(
        "m2", "comm_msg", comm_id="w1", data={"method": "update", "state": {"msg_id": "m2"}}
    )
    kernel.add(stream("stdout", "captured\n", "m2"))
    kernel.output("m2", "comm_close", comm_id="w1", data={})
    kernel.add(stream("stdout", "shown\n", "m2"))
    kernel.add(status("idle", "m2"))

    first, second = kernel.restore()
    assert first["status"] == "ok"  # the widget showed the error; the cell ran on
    assert first["outputs"] == [
        {
            "output_type": "display_data",
            "data": {"text/plain": "Output()", "application/vnd.jupyter.widget-view+json": view},
            "metadata": {},
        },
        {"output_type": "stream", "name": "stdout", "text": "before\nafter\n"},
    ]
    assert second["outputs"] == [{"output_type": "stream", "name": "stdout", "text": "shown\n"}]
