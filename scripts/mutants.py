"""The curated mutants of scripts/mutation.py: one-line bugs in the code that carries
corral's promises (safe retries, exclusive GPUs, rank variables, no leaks, hostile input).

Each names a file under src/corral, a snippet that must occur exactly once in it (code is
found by text, not line number, so a refactor that moves code keeps the mutant; one that
changes the code makes it STALE, to be updated here), its replacement, and the tests
(pytest arguments) that must fail with it, on which backend.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str
    find: str
    replace: str
    tests: str
    backend: str = "local"
    why: str = ""


# test selections (pytest arguments, run from the repository root)
WIRE = "tests/unit/test_wire.py"
FUZZ = "tests/unit/test_wire_fuzz.py"
RPC = "tests/unit/test_rpc_server.py"
WATCH = "tests/unit/test_controller_watch.py"
NR = "tests/unit/test_name_resolve_contract.py"
FAULTS = "tests/faults/test_restart_and_connections.py"
GPUS = "tests/conformance/test_gpus_and_ranks.py"
LIFE = "tests/conformance/test_lifecycle.py"
FAIL = "tests/conformance/test_failures.py"
COLO = "tests/conformance/test_colocation.py"
ENGINES = "tests/conformance/test_engines.py"
DEATH = "tests/conformance/test_controller_death.py"
NET = "tests/conformance/test_network_faults.py -k cut_mid_transfer"
STATS = "tests/observe/test_stats.py"
DASH = "tests/observe/test_dashboard_http.py"
OBS_UNITS = "tests/unit/test_observe_units.py"
SHM_SEC = "tests/security/test_shared_memory.py"

M = Mutant
MUTANTS: list[Mutant] = [
    # ------------------------------------------------------------------ rpc/wire.py
    M("wire-tensor-fit", "rpc/wire.py",
      "if math.prod(shape) * itemsize != buf.nbytes:", "if False:",
      f"{WIRE} {RPC} -k does_not_fit",
      why="tensor length-vs-shape check removed"),
    M("wire-array-fit", "rpc/wire.py",
      "if math.prod(shape) * dtype.itemsize != buf.nbytes:", "if False:",
      f"{WIRE} -k does_not_fit",
      why="numpy array length-vs-shape check removed"),
    M("wire-buffer-past-end", "rpc/wire.py",
      "if pos + length > view.nbytes:", "if False:", FUZZ,
      why="a buffer length past the end of the frame is not refused"),
    M("wire-trailing-bytes", "rpc/wire.py",
      "if pos != view.nbytes:", "if False:", FUZZ,
      why="trailing bytes after the last buffer are accepted"),
    M("wire-negative-buffer-index", "rpc/wire.py",
      "if not isinstance(index, int) or not 0 <= index < len(self.buffers):",
      "if not isinstance(index, int) or not index < len(self.buffers):", FUZZ,
      why="a negative buffer index is accepted"),
    M("wire-numpy-object-dtype", "rpc/wire.py",
      "if dtype.kind not in _NUMPY_KINDS:", "if False:", f"{WIRE} {FUZZ}",
      why="object/struct numpy dtypes are decoded"),
    M("wire-torch-dtype-allowlist", "rpc/wire.py",
      'name = node["d"]\n        if name not in _TORCH_DTYPES:',
      'name = node["d"]\n        if False:', f"{WIRE} {FUZZ}",
      why="any torch attribute name is accepted as a dtype"),
    M("wire-max-buffers", "rpc/wire.py",
      "if header_len > MAX_HEADER_BYTES or n_buffers > MAX_BUFFERS:",
      "if header_len > MAX_HEADER_BYTES:", WIRE,
      why="the decoder no longer limits the buffer count"),
    M("wire-imports-named-module", "rpc/wire.py",
      "module: Any = sys.modules.get(module_name)",
      "module: Any = __import__(module_name) and sys.modules.get(module_name)",
      f"{WIRE} -k import",
      why="decoding a dataclass imports the module named in the frame"),
    # ------------------------------------------------------------------ rpc/http.py
    M("http-content-length-digits", "rpc/http.py",
      "if not raw.isdigit():", "if False:", f"{WIRE} -k content_length",
      why="a non-numeric or negative Content-Length is accepted"),
    M("http-connection-close", "rpc/http.py",
      'return self.headers.get("connection", "").lower() != "close"', "return True",
      f"{WIRE} {RPC} -k 'connection_close or not_pooled'",
      why="'Connection: close' is ignored (the connection is reused after a refusal)"),
    # ------------------------------------------------------------------ rpc/server.py
    M("server-secret-check", "auth.py",
      "        if not hmac.compare_digest(self.keys.sign(self.keys.request, fields), sig):\n"
      '            return "wrong signature',
      "        if False:\n"
      '            return "wrong signature',
      f"{RPC} -k unauthenticated",
      why="requests not signed with the trial secret are served"),
    M("server-body-limit", "rpc/server.py",
      "if length > self._max_body:", "if False:", f"{WIRE} -k max_body",
      why="bodies over the limit are read"),
    M("server-identity-check", "rpc/server.py",
      "if wanted and self.identity and wanted != self.identity:", "if False:",
      f"{FAULTS} -k stale",
      why="a request meant for another worker (stale address) is served"),
    M("server-delivery-proof", "rpc/server.py",
      "if answered and self._delivered is not None:", "if False:",
      f"{FAULTS} -k delivered",
      why="a delivered large reply is never dropped from the cache"),
    M("server-shm-ack-proof", "rpc/server.py",
      'if msg.method == "ACK" and answered and self._delivered is not None:', "if False:",
      f"{FAULTS} -k delivered",
      why="a shared-memory reply the client ACKed is never dropped from the cache"),
    # ------------------------------------------------------------------ rpc/client.py
    M("client-409-is-unreachable", "rpc/protocol.py",
      "if msg.status == 409:", "if msg.status == 4090:", f"{FAULTS} -k stale",
      why="a 409 (stale address) is not reported as an unreachable worker"),
    M("client-remote-call-error-type", "rpc/protocol.py",
      "raise errors.EngineCallError(message, remote_traceback=tb)",
      "raise errors.SchedulerError(message)",
      f"{ENGINES} -k call_error",
      why="an engine's exception comes back without its type and traceback"),
    M("client-stale-pooled-connection", "rpc/client.py",
      "                conn.close()\n                if reused and not retried:",
      "                conn.close()\n                if False:", f"{RPC} -k pooled",
      why="a pooled connection the worker closed fails the call instead of being redialled"),
    # ------------------------------------------------------------------ worker/runtime.py
    M("cache-replays-reply", "worker/result_cache.py",
      "                    return self._done[request_id]\n",
      "                    self._done.pop(request_id)\n", f"{RPC} -k request_id",
      why="a repeated request id runs the method again"),
    M("cache-never-drops-large", "worker/result_cache.py",
      "if old is None or wire.frame_size(old.parts) < LARGE_REPLY_BYTES:", "if True:",
      f"{FAULTS} -k delivered",
      why="delivered large replies stay in the cache"),
    M("cache-late-duplicate-runs", "worker/result_cache.py",
      "if request_id in self._delivered:", "if False:", f"{FAULTS} -k delivered",
      why="a late duplicate of a delivered request runs again"),
    M("cache-concurrent-duplicate", "worker/result_cache.py",
      "if request_id not in self._running:", "if True:",
      f"{RPC} -k concurrent_duplicates",
      why="a duplicate arriving while the first runs is run in parallel"),
    M("runtime-set-env", "worker/runtime.py",
      "os.environ[str(key)] = str(value)", "pass", f"{LIFE} -k rendezvous",
      why="/set_env does not set the variables (no rendezvous env)"),
    M("runtime-decode-error-400", "worker/runtime.py",
      "        except ProtocolError as exc:\n            return failure(400, exc)",
      "        except KeyError as exc:\n            return failure(400, exc)",
      f"{RPC} -k does_not_fit",
      why="a malformed frame escapes the handler instead of getting a 400"),
    M("watch-lease-stale", "worker/watch.py",
      "elif time.monotonic() - last_change > s.lease_timeout + grace:", "elif False:", WATCH,
      why="a lease that stops changing is never noticed"),
    M("watch-lease-change-time", "worker/watch.py",
      "last_value, last_change = value, time.monotonic()", "last_value = value", WATCH,
      why="staleness counts from the watch's start, not the lease's last change"),
    M("watch-lease-removed", "worker/watch.py",
      'return self.on_lost("controller lease removed")', "pass", WATCH,
      why="a removed lease is not noticed as such"),
    M("watch-controller-pid", "worker/watch.py",
      "if not grace and same_host and not pid_alive(s.controller_pid):", "if False:", WATCH,
      why="a dead controller on the same host is not noticed by its pid"),
    M("watch-pid-other-host", "worker/watch.py",
      "same_host = s.controller_pid and s.controller_host == socket.gethostname()",
      "same_host = s.controller_pid", WATCH,
      why="a controller pid on another host is looked up on this one"),
    M("watch-lease-other-run", "worker/watch.py",
      "if mine and owner and owner != mine:", "if False:", WATCH,
      why="a worker keeps serving after another run took over its trial's lease"),
    # ------------------------------------------------------------------ worker/fork.py
    M("fork-module-allowlist", "worker/fork.py",
      "if not _MODULE.fullmatch(module):", "if False:", f"{RPC} -k fork",
      why="/fork starts any string as a module"),
    M("fork-kill-child", "worker/fork.py",
      "stop_process_groups([child.proc], grace)", "pass", f"{COLO} -k deleting",
      why="deleting a forked role leaves its processes running"),
    M("fork-die-with-parent", "worker/fork.py",
      'E.DIE_WITH_PARENT: "1",', 'E.DIE_WITH_PARENT: "0",',
      "tests/faults/test_teardown_order.py -k forked_child",
      why="forked children do not ask for the parent-death signal"),
    # ------------------------------------------------------------------ worker/engines.py
    M("engines-one-thread", "worker/engines.py",
      "        self._thread.submit(task)\n",
      "        threading.Thread(target=task.run, name='corral-engine_0').start()\n",
      f"{ENGINES} -k one_engine_thread",
      why="synchronous engine methods run on several threads"),
    M("engines-import-path-check", "worker/engines.py",
      "if not isinstance(path, str) or not re.fullmatch(_IMPORT_PATH, path):",
      "if not isinstance(path, str):", f"{RPC} {ENGINES} -k import",
      why="malformed engine import paths are passed to importlib"),
    # ------------------------------------------------------------------ scheduler.py
    M("retry-new-request-id", "calls.py",
      "        request_id = new_request_id()\n        for attempt in range(retries + 1):\n"
      "            if attempt and retry_delay:\n                time.sleep(",
      "        for attempt in range(retries + 1):\n            request_id = new_request_id()\n"
      "            if attempt and retry_delay:\n                time.sleep(",
      f"{FAULTS} -k cut_reply",
      why="survivor 1: each retry gets a new request id (method runs twice)"),
    M("retry-new-request-id-async", "calls.py",
      "        request_id = new_request_id()\n        for attempt in range(retries + 1):\n"
      "            if attempt and retry_delay:\n                await asyncio.sleep(",
      "        for attempt in range(retries + 1):\n            request_id = new_request_id()\n"
      "            if attempt and retry_delay:\n                await asyncio.sleep(",
      f"{FAULTS} -k cut_reply",
      why="same, in the async call path"),
    M("retry-exhausted-returns-none", "calls.py",
      "        if attempt == retries:\n            raise WorkerConnectionError(",
      "        if attempt == retries + 1:\n            raise WorkerConnectionError(",
      NET, why="a call whose retries are used up returns None instead of raising"),
    M("local-rank-not-counted", "rendezvous.py",
      "hosts[worker.host] = local_rank + 1", "hosts[worker.host] = local_rank",
      f"{GPUS} -k per_node", why="survivor 4: LOCAL_RANK is 0 for every worker"),
    M("world-size-off", "rendezvous.py",
      '"WORLD_SIZE": str(len(workers)),', '"WORLD_SIZE": str(len(workers) - 1),',
      f"{LIFE} -k rendezvous", why="WORLD_SIZE off by one"),
    M("diagnose-dead-worker", "watch.py",
      "            if index in dead:\n                kind = (",
      "            if False:\n                kind = (", f"{FAIL} -k exits",
      why="a worker that died mid-call is reported as a broken connection"),
    M("delete-destroys-engines-first", "calls.py",
      'await asyncio.gather(*(quietly(w, "/destroy_engines", 5.0) for w in workers))', "pass",
      f"{LIFE} tests/faults/test_teardown_order.py -k 'destroyed or slow_destroy'", why="engines are not destroyed before workers stop"),
    M("delete-takes-forks-along", "teardown.py",
      "for dependent in [r for r, s in table.items() if s.target == role]:",
      "for dependent in []:", f"{COLO} -k target_takes",
      why="deleting a role leaves its forked roles behind"),
    M("restart-flag", "restarts.py",
      "failure.restarted = True", "failure.restarted = False", f"{FAULTS} -k restart_policy",
      why="a restarted worker's failure does not say it was restarted"),
    # ------------------------------------------------------------------ backends/local.py
    M("local-cuda-off-by-one", "backends/local.py",
      '",".join(map(str, devices))', '",".join(str(d + 1) for d in devices)', GPUS,
      why="survivor 2: CUDA_VISIBLE_DEVICES off by one"),
    M("local-ledger-total", "backends/local.py",
      "if need > len(self._free):", "if need > len(self.devices):", GPUS,
      why="survivor 3: the GPU ledger compares against total devices, not free ones"),
    M("local-ledger-not-freed", "backends/local.py",
      'if self.sharing == "exclusive":\n                    self._free.extend(devices)',
      'if False:\n                    self._free.extend(devices)', f"{GPUS} -k refused",
      why="a deleted role's GPUs are never free again"),
    M("local-stop-kills", "backends/local.py",
      "                stop_process_groups([proc])\n        stop_process_groups(procs)",
      "                stop_process_groups([proc])", f"{FAIL} -k frozen",
      why="stopping a role does not force its processes out"),
    M("local-poll-exit", "backends/local.py",
      "            if code is not None:\n                path = replica_log_path(",
      "            if False:\n                path = replica_log_path(", f"{FAIL} -k exits",
      why="a dead local worker is never reported dead"),
    M("local-die-with-parent", "backends/local.py",
      'env[E.DIE_WITH_PARENT] = "1"', 'env[E.DIE_WITH_PARENT] = "0"', f"{DEATH} -k sigkill",
      why="local workers do not ask for the parent-death signal"),
    # ------------------------------------------------------------------ discovery
    M("files-add-refuses-existing", "discovery/files.py",
      "os.link(tmp, target)", "os.replace(tmp, target)", f"{NR} -k second_add",
      why="a second add of a key silently overwrites it"),
    M("files-clear-subtree", "discovery/files.py",
      "shutil.rmtree(self._path(prefix), ignore_errors=True)", "pass", f"{NR} -k clear",
      why="clear_subtree leaves the keys"),
    M("files-subtree-prefix", "discovery/files.py",
      "return self._walk(self._path(prefix))", "return self._walk(self.root)",
      f"{NR} -k subtree", why="get_subtree returns keys outside the prefix"),
    M("keys-dotdot", "discovery/base.py",
      'if part in ("", ".", "..") or part.startswith(".")', 'if part in ("",)',
      f"{NR} -k bad_keys", why="'..' and dot-parts escape the store's root"),
    M("etcd-create-if-absent", "discovery/etcd.py",
      '"result": "EQUAL", "create_revision": "0"', '"result": "NOT_EQUAL", "create_revision": "0"',
      f"{NR} -k second_add", why="etcd add without replace overwrites (or never writes)"),
    M("sbatch-nodes", "backends/slurm_layout.py",
      "nodes = max(1, math.ceil(total_gpus / n_gpus_per_node)) if gpu > 0 else 1",
      "nodes = max(1, total_gpus // n_gpus_per_node) if gpu > 0 else 1",
      "tests/unit/test_sbatch.py", why="the node count rounds down"),
    # ------------------------------------------------------------------ Ray
    M("ray-node-as-host", "backends/ray_actor.py",
      "        os.environ[E.NODE] = ctx.get_node_id()", "        pass",
      f"{GPUS} -k per_node", backend="ray",
      why="Ray workers report the host name, so LOCAL_RANK counts across Ray nodes"),
    M("ray-fork-devices", "backends/ray_fork.py",
      'visible_devices=info.get("visible_devices") if kind else None,',
      "visible_devices=None,", f"{GPUS} -k exact_devices", backend="ray",
      why="a forked child does not see its target's GPUs"),
    # ------------------------------------------------------------------ Slurm
    M("slurm-scancel-in-stop", "backends/slurm_stop.py",
      'r = _run(["scancel", *ids], timeout=QUERY_TIMEOUT_SECONDS)',
      'r = _run(["true", *ids], timeout=QUERY_TIMEOUT_SECONDS)',
      f"{FAIL} -k frozen", backend="slurm",
      why="stop never scancels, so a job whose worker cannot exit stays"),
    M("slurm-gpus-by-procid", "backends/sbatch.py",
      "corral_first=$(( ${SLURM_LOCALID:-0} * corral_gpus ))",
      "corral_first=$(( ${SLURM_PROCID:-0} * corral_gpus ))",
      f"{GPUS} -k exact_devices", backend="slurm",
      why="a task picks GPUs by its global rank, not its rank on the node"),
    # ------------------------------------------------------------------ live view (observe/)
    M("stats-no-exit-code", "observe/snapshot.py",
      "exit_code=exit_.exit_code,", "exit_code=None,",
      f"{STATS} -k killed", why="a failed worker shows no exit code"),
    M("stats-no-restarts", "observe/snapshot.py",
      '"restarts": state.restarts.get(index, 0),', '"restarts": 0,',
      f"{STATS} -k restarted", why="restarts are not counted in the view"),
    M("stats-file-mode", "observe/publisher.py",
      "0o600)", "0o644)", f"{STATS} -k private", why="the stats file is world-readable"),
    M("stats-hook-end", "calls.py",
      "            self.stats.end(worker.role, started, ok)",
      "            pass",
      f"{STATS} -k count_calls", why="engine calls are never recorded as finished"),
    M("stats-drain-order", "observe/calls.py",
      "window = _drain(self._ended)  # ended first", "window = []  # ended first",
      f"{OBS_UNITS} -k lose_no", why="finished calls are dropped by the sampler"),
    M("dashboard-open", "observe/dashboard.py",
      "return any(", "return True or any(",
      f"{DASH} -k needs_the_token", why="the dashboard answers without the token"),
    M("dashboard-traversal", "observe/source.py",
      '    if experiment != "*":\n        validate_role_name(experiment, "experiment")',
      '    if False:\n        validate_role_name(experiment, "experiment")',
      f"{DASH} -k leave_the_fileroot", why="a log request names a path outside the fileroot"),
    M("dashboard-no-io-timeout", "observe/dashboard.py",
      "        timeout = IO_TIMEOUT\n", "        pass\n",
      f"{DASH} -k never_sends", why="a connection that never sends its head holds a thread"),
    M("fork-death-unrecorded", "worker/fork.py",
      "                self._watch(child_id)\n", "                pass\n",
      f"{STATS} -k forked_child", why="a forked child that dies alone stays running"),
    # ------------------------------------------------------------------ shared memory (security)
    M("shm-headers-unsigned", "rpc/shm.py",
      r'    return "\n".join(f"{n}: {headers[n]}" for n in SIGNED_HEADERS if n in headers)',
      '    return headers.get(SEGMENT_HEADER, "")',
      f"{SHM_SEC} -k covered", why="offer/released headers can be changed on the way"),
    M("shm-foreign-segment", "rpc/shm.py",
      "if st.st_uid != os.geteuid() or st.st_mode & 0o077:", "if False:",
      f"{SHM_SEC} -k refuses", why="a reader maps another user's (or a 0644) memfd"),
]  # fmt: skip
