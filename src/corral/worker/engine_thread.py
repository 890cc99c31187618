"""The engine thread: one long-lived thread that runs a worker's engine calls in order.

When it has nothing queued, it may wait on a connection's socket as well (``park``): the
RPC server lends it a one-request-at-a-time connection after an engine call, and the next
call on it is read, run and answered there, with no hand-off between threads
(``rpc/connection.py``). Anything queued meanwhile wakes it (a pipe it also polls).

A thread may ``hold`` what it submits and ``release`` it as one ``Batch``: the RPC server
does so for the pipelined calls of one receive (one wake-up, replies sent together).
"""

from __future__ import annotations

import _thread
import os
import select
import threading
from _queue import Empty, SimpleQueue  # queue's own classes, without queue.py and heapq

TYPE_CHECKING = False  # typing's, without importing typing (a worker's start)
if TYPE_CHECKING:
    from typing import Any


class EngineThread:
    """One long-lived thread that runs calls in order; each caller waits on a plain lock.

    A lighter hand-off than ``ThreadPoolExecutor.submit().result()`` (no Future, no
    Condition): this hop is on every engine call's path. While the thread waits on a
    socket in ``park``, whoever queues work also writes to its wake-up pipe."""

    def __init__(self, name: str = "corral-engine_0"):
        self.name = name
        self._queue: SimpleQueue = SimpleQueue()
        self._thread: threading.Thread | None = None
        self.ident: int | None = None  # the thread's id, once started
        self._start_lock = threading.Lock()
        self._closed = False
        self._parked = False  # in park(): work queued must also write to the wake-up pipe
        self._wake_fds: tuple[int, int] | None = None  # made by the first park
        self._poll = None
        self._polled_fd = -1
        self._held: dict[int, list] = {}  # thread id -> its tasks held back (``hold``)
        self._ident: int | None = None  # the thread's, once it runs

    def _ensure(self) -> threading.Thread:
        if self._closed:
            raise RuntimeError("the engine thread is shut down (the worker is stopping)")
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
                    thread.start()
                    self.ident = thread.ident
                    self._thread = thread
        return self._thread

    def run(self, fn, *args, **kwargs) -> Any:
        """Run ``fn`` on the engine thread and return its result (raise its exception)."""
        if self._ensure() is threading.current_thread():
            return fn(*args, **kwargs)  # already there (an engine calling back in)
        if self._held:  # the caller's held tasks go first (it would wait for them forever)
            held = self._held.get(_thread.get_ident())
            if held:
                self._held[_thread.get_ident()] = []
                self._put(Batch(held))
        done = _thread.allocate_lock()
        done.acquire()
        box: list = [None, None]
        self._queue.put((fn, args, kwargs, done, box))
        if self._parked:
            self._wake()
        done.acquire()
        error = box[1]
        if error is not None:
            box.clear()
            raise error
        return box[0]

    def submit(self, task: Any) -> None:
        """Queue ``task.run()`` without waiting; if the thread shuts down before it runs,
        ``task.cancel()`` is called instead. Between ``hold`` and ``release`` on the calling
        thread, the task is held back and queued with the others in one batch."""
        self._ensure()
        if self._held:
            held = self._held.get(_thread.get_ident())
            if held is not None:
                held.append(task)
                return
        self._put(task)

    def _put(self, item) -> None:
        self._queue.put(item)
        if self._parked:
            self._wake()

    def hold(self) -> None:
        """Hold back what the calling thread submits until its ``release``: tasks read
        from one receive (pipelined calls, ``rpc.server``) then wake this thread once, not
        once each, and run in the order they were submitted."""
        self._held[_thread.get_ident()] = []

    def holding(self) -> bool:
        """Does the calling thread hold tasks back (so it must not wait for this thread)?"""
        return bool(self._held) and _thread.get_ident() in self._held

    def busy_here(self) -> bool:
        """``on_thread() or holding()``, in one look: may the caller not wait for this
        thread?"""
        me = _thread.get_ident()
        return me == self._ident or me in self._held

    def release(self, after=None, finished=None) -> None:
        """Queue what the calling thread held back since ``hold``, as one item;
        ``after(last)`` runs on this thread after each of them (``Batch``), or once with
        True if none was held."""
        held = self._held.pop(_thread.get_ident(), None)
        if held or (after is not None and self._thread is not None):
            batch = Batch(held or [], after, finished)
            if self._closed:  # shut down meanwhile: nothing would run it
                batch.cancel()
            else:
                self._put(batch)
        else:  # nothing to run and no engine thread yet
            if after is not None:
                after(True)
            if finished is not None:
                finished()

    def on_thread(self) -> bool:
        """Is the caller the engine thread?"""
        return _thread.get_ident() == self._ident

    def idle(self) -> bool:
        """Is nothing queued (a call met on this thread may run at once, jumping no one)?"""
        return self._queue.empty()

    def park(self, fd: int, timeout: float) -> bool:
        """On the engine thread, with nothing queued: wait until ``fd`` is readable (True),
        or until work is queued or ``timeout`` seconds pass (False)."""
        if self._wake_fds is None:
            self._wake_fds = os.pipe()
            os.set_blocking(self._wake_fds[0], False)
            os.set_blocking(self._wake_fds[1], False)
            self._poll = select.poll()  # poll, not select: fds may be above 1023
            self._poll.register(self._wake_fds[0], select.POLLIN)
        if fd != self._polled_fd:  # poll(2) is stateless: a registration is only a number
            if self._polled_fd >= 0:
                self._poll.unregister(self._polled_fd)
            self._poll.register(fd, select.POLLIN)
            self._polled_fd = fd
        self._parked = True
        try:
            if self._closed or not self._queue.empty():  # queued before _parked was set
                return False
            events = self._poll.poll(timeout * 1000.0)
        finally:
            self._parked = False
        readable = False
        for ready, _ in events:
            if ready == fd:
                readable = True
            else:  # the wake-up pipe: drain it
                try:
                    os.read(ready, 512)
                except BlockingIOError:
                    pass
        return readable and self._queue.empty()

    def _wake(self) -> None:
        try:
            os.write(self._wake_fds[1], b"!")
        except BlockingIOError:  # the pipe is full: it is woken already
            pass

    def _serve(self) -> None:
        self._ident = _thread.get_ident()
        while True:
            item = self._queue.get()
            if item is None:
                return
            if not isinstance(item, tuple):
                try:
                    item.run()
                except BaseException:  # a task reports its own errors; never end the thread
                    pass
                del item
                continue
            fn, args, kwargs, done, box = item
            try:
                box[0] = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the caller, raised there
                box[1] = exc
            finally:
                done.release()
            del item, fn, args, kwargs, done, box

    def close(self) -> None:
        """Refuse new calls; calls still queued fail; the thread ends after its current one."""
        self._closed = True
        while True:
            try:
                item = self._queue.get_nowait()
            except Empty:
                break
            if isinstance(item, tuple):
                item[4][1] = RuntimeError("the engine thread is shut down (the worker is stopping)")
                item[3].release()
            elif item is not None:
                item.cancel()
        self._queue.put(None)
        if self._parked:
            self._wake()


class Batch:
    """Tasks queued as one item (``EngineThread.release``): run in order, each as if
    queued alone (one that raises does not stop the others).

    ``after(last)``: called after each task, ``last`` True after the last one (or once,
    if there is none): the RPC server's ``rpc.unsent.Unsent.settle``, which sends the
    replies gathered so far unless the connection's thread watches them (then it sends
    them within a bound: a reply never waits long while a later call runs, as any call
    may block, whatever it took before). ``finished``: called once all ran (or were
    cancelled) and their replies went."""

    __slots__ = ("tasks", "after", "finished")

    def __init__(self, tasks: list, after=None, finished=None):
        self.tasks = tasks
        self.after = after
        self.finished = finished

    def run(self) -> None:
        tasks, self.tasks = self.tasks, []
        flush = self.after
        last = len(tasks) - 1
        for i, task in enumerate(tasks):
            try:
                task.run()
            except BaseException:  # a task reports its own errors
                pass
            tasks[i] = None  # done: do not pin its reply while the rest run
            if flush is not None:
                flush(i == last)
        if flush is not None and not tasks:
            flush(True)
        if self.finished is not None:
            self.finished()

    def cancel(self) -> None:
        tasks, self.tasks = self.tasks, []
        for task in tasks:
            task.cancel()
        if self.after is not None:
            self.after(True)
        if self.finished is not None:
            self.finished()
