"""``lib/heartbeat.py``: a line after each quiet spell, none while output flows, and what the
main thread is doing read off its stack."""

import io
import sys
import threading
import time

from megatron_musa_patch.lib.heartbeat import Heartbeat, NoticingStream, describe_stack


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _wait_for(predicate, timeout=5.0):
    end = time.monotonic() + timeout
    while not predicate() and time.monotonic() < end:
        time.sleep(0.01)
    return predicate()


def test_a_line_after_each_quiet_spell_and_none_while_output_flows():
    clock, said = Clock(), []
    beat = Heartbeat(said.append, lambda elapsed: f"busy {elapsed:.0f}", quiet_s=5,
                     poll_s=0.01, clock=clock).start()
    try:
        clock.now += 4.9
        time.sleep(0.1)
        assert said == []
        clock.now += 0.2
        assert _wait_for(lambda: said == ["busy 5"])
        clock.now += 4
        beat.written()  # output came: the next line is due 5 s after it
        clock.now += 4
        time.sleep(0.1)
        assert said == ["busy 5"]
        clock.now += 1.5
        assert _wait_for(lambda: len(said) == 2)
    finally:
        beat.stop()


def test_until_and_most_end_it():
    clock, said, done = Clock(), [], []
    beat = Heartbeat(said.append, lambda e: "x", quiet_s=1, poll_s=0.01, clock=clock,
                     until=lambda: bool(done)).start()
    done.append(True)
    clock.now += 10
    time.sleep(0.1)
    assert said == [] and not beat._thread.is_alive()
    beat = Heartbeat(said.append, lambda e: "x", quiet_s=1, most_s=3, poll_s=0.01,
                     clock=clock).start()
    clock.now += 10
    time.sleep(0.1)
    assert said == [] and not beat._thread.is_alive()


def test_another_process_s_last_line_counts():
    clock = Clock()
    beat = Heartbeat(print, lambda e: "x", quiet_s=5, clock=clock)
    beat.written_at(time.time() - 3)
    assert abs((clock() - beat.last) - 3) < 0.1
    assert abs(beat.last_output() - (time.time() - 3)) < 0.1


def test_a_noticing_stream_notices_and_stays_the_stream():
    seen, buffer = [], io.StringIO()
    stream = NoticingStream(buffer, lambda: seen.append(1))
    stream.write("")
    assert seen == []
    print("hello", file=stream)
    assert seen and buffer.getvalue() == "hello\n" and stream.getvalue() == "hello\n"
    holder = type("Holder", (), {"stdout": io.StringIO(), "stderr": io.StringIO()})()
    original = holder.stdout
    beat = Heartbeat(print, lambda e: "x")
    beat.notice(holder)
    assert isinstance(holder.stdout, NoticingStream)
    beat.stop()
    assert holder.stdout is original


def setup_model_and_optimizer(event, frames):
    frames.append(sys._getframe())
    event.wait(5)


def test_the_innermost_known_function_names_the_phase():
    event, frames = threading.Event(), []
    thread = threading.Thread(target=setup_model_and_optimizer, args=(event, frames))
    thread.start()
    try:
        assert _wait_for(lambda: frames)
        phases = {"setup_model_and_optimizer": "building the model", "run": "running"}
        assert describe_stack(frames[0], phases) == "building the model"
        assert describe_stack(frames[0], {}, default="starting") == "starting"
    finally:
        event.set()
        thread.join()
