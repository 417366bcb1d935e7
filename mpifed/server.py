"""The server's round, top to bottom: sample, assign, send, reduce, aggregate, evaluate, log.

Rank 0 runs :class:`Server`. Under MPI the workers run ``worker.serve``, which makes
the same collectives in the same order. In the single-process debug mode the server
calls its in-process worker where the collectives would be, so both modes share every
line of the round.
"""
from __future__ import annotations

import io
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mpifed import checkpoint
from mpifed.algorithms.base import Algorithm, ServerTools
from mpifed.comm import Comm
from mpifed.config import Config, math_fingerprint
from mpifed.data.prepared import Manifest
from mpifed.evaluation import eval_packer, forgetting, summarize
from mpifed.plan import RoundPlan, assign_clients, sample_clients
from mpifed.rundir import RunDir, atomic_write
from mpifed.signals import received, stop_requested
from mpifed.worker import Worker, downlink_packer, state_packer, uplink_packer, usage

EXIT_STOPPED = 75  # stopped on a signal after writing a checkpoint: resume with --resume


class Server:
    def __init__(self, cfg: Config, cfg_dict: dict[str, Any], manifest: Manifest, algo: Algorithm, world: Comm,
                 run: RunDir, tools: ServerTools, workers: int, local_worker: Worker | None,
                 resume: dict[str, Any] | None) -> None:
        self.cfg = cfg
        self.cfg_dict = cfg_dict
        self.manifest = manifest
        self.algo = algo
        self.world = world
        self.run_dir = run
        self.tools = tools
        self.workers = workers
        self.local_worker = local_worker
        self.device = tools.flat.floats.device
        num_floats, num_ints = tools.flat.num_floats, tools.flat.ints.numel()
        self.down = downlink_packer(algo, num_floats, num_ints)
        self.up = uplink_packer(algo, num_ints)
        self.state = state_packer(num_floats, num_ints)
        self.eval = eval_packer(manifest.test_size, cfg.train.eval_batch_size, manifest.num_classes, len(manifest.group_names))
        self.metrics: list[dict[str, Any]] = []
        self.start_round = 0
        self.last_checkpoint: Path | None = None
        self.last_checkpoint_round = 0
        self.elapsed_before = 0.0
        self.started = time.perf_counter()
        self.worker_stop = False
        if resume is None:
            self.global_floats = tools.flat.floats.detach().clone()
            self.global_ints = tools.flat.ints.detach().clone()
            for log in ("metrics.jsonl", "clients.jsonl"):
                run.write_rows(log, [])
            algo.server_start(self.global_floats, tools)
        else:
            self._restore(resume)
            algo.server_start(self.global_floats, tools)
            algo.load_state_dict(resume["algorithm"])
        world.context = self.describe_checkpoint

    # ------------------------------------------------------------------ the run
    def run(self) -> int:
        """Run the remaining rounds; returns the process exit code (0 done, 75 stopped)."""
        self.started = time.perf_counter()
        self.first_round_at = time.time()
        rounds = self.cfg.train.rounds
        rnd = self.start_round
        while rnd < rounds and not self._stop_now():
            self.run_round(rnd)
            rnd += 1
        stopped = rnd < rounds
        self._broadcast_stop()
        if self.last_checkpoint_round != rnd:
            self.checkpoint(rnd)
        if not stopped and self.cfg.run.save_model:
            self._save_model()
        self._write_summary(rnd, "stopped" if stopped else "finished")
        if stopped:
            self.run_dir.log(f"[mpifed] stopped after round {rnd} on {', '.join(received())}; "
                             f"resume with --resume (checkpoint {self.last_checkpoint})")
            return EXIT_STOPPED
        return 0

    def run_round(self, rnd: int) -> None:
        t = {"round": time.perf_counter()}
        cfg, world = self.cfg, self.world
        clients = sample_clients(cfg.run.seed, rnd, self.manifest.num_clients, cfg.train.participation)
        plan = RoundPlan(round=rnd, lr=cfg.train.lr * cfg.train.lr_decay ** rnd,
                         assignment=assign_clients(clients, self.manifest.client_sizes, self.workers),
                         evaluate=(rnd + 1) % cfg.run.eval_every == 0 or rnd + 1 == cfg.train.rounds,
                         keep_states_from=self._oldest_resume_round(rnd))
        world.sync("start of round")
        world.bcast_object(plan)

        mark = time.perf_counter()
        down_buf = self.down.pack({"global": self.global_floats, "global_ints": self.global_ints,
                                   **self.algo.downlink(rnd, self.global_floats)})
        world.bcast_buffer(down_buf)
        t["downlink"] = time.perf_counter() - mark

        mark = time.perf_counter()
        if self.local_worker is not None:
            up_buf, reports = self.local_worker.train_round(plan, self.down.views(down_buf))
        else:
            up_buf, reports = self.up.empty(), []
        world.sync("end of local training")
        t["local_training"] = time.perf_counter() - mark

        mark = time.perf_counter()
        totals = self.up.views(world.reduce_sum(up_buf.view(np.float64)).view(np.uint8))
        gathered = world.gather_object((reports, stop_requested()))
        t["uplink"] = time.perf_counter() - mark
        reports = [r for worker_reports, _ in gathered for r in worker_reports]
        self.worker_stop = any(flag for _, flag in gathered)

        mark = time.perf_counter()
        self.global_floats = self.algo.aggregate(
            rnd, self.global_floats, {k: totals[k].to(self.device) for k in self.algo.uplink_spec()})
        self.global_ints = torch.round(totals["_ints"] / totals["_samples"]).to(torch.int64).to(self.device)
        self.algo.after_round(rnd, self.global_floats)
        t["aggregate"] = time.perf_counter() - mark

        result: dict[str, Any] = {}
        if plan.evaluate:
            mark = time.perf_counter()
            result = self.evaluate()
            t["evaluation"] = time.perf_counter() - mark
        self._record(rnd, plan, reports, result, t)
        if cfg.run.checkpoint_every and (rnd + 1) % cfg.run.checkpoint_every == 0 and rnd + 1 < cfg.train.rounds:
            self.checkpoint(rnd + 1)

    def evaluate(self) -> dict[str, Any]:
        """Test-set metrics of the current global model, computed by the workers."""
        self.world.sync("evaluation")
        state_buf = self.state.pack({"global": self.global_floats, "global_ints": self.global_ints})
        self.world.bcast_buffer(state_buf)
        if self.local_worker is not None:
            share = self.local_worker.evaluate(self.global_floats, self.global_ints)
        else:
            share = self.eval.empty()
        self.world.sync("end of evaluation")
        totals = self.eval.views(self.world.reduce_sum(share.view(np.float64)).view(np.uint8))
        m = self.manifest
        return summarize(totals, m.test_class_counts, m.test_group_counts, m.group_names)

    # ------------------------------------------------------------ bookkeeping
    def _record(self, rnd: int, plan: RoundPlan, reports: list, result: dict[str, Any], t: dict[str, float]) -> None:
        t["round"] = time.perf_counter() - t["round"]
        samples = sum(r.samples for r in reports)
        busy = [sum(r.seconds for r in reports if r.worker == w) for w in range(self.workers)]
        timing = {k: round(v, 4) for k, v in t.items()}
        timing["worker_idle_mean"] = round(t["local_training"] - statistics.fmean(busy), 4)
        row: dict[str, Any] = {"round": rnd + 1, "lr": plan.lr, "clients": len(reports),
                               "train_loss": sum(r.train_loss * r.samples for r in reports) / max(samples, 1)}
        row.update(result)
        row.update(self.algo.round_log())
        row["time"] = timing
        self.metrics.append(row)
        self.run_dir.append_row("metrics.jsonl", row)
        self.run_dir.append_row("clients.jsonl", {"round": rnd + 1, "clients": [asdict(r) for r in reports]})
        acc = f"  acc {row['test_acc']:.4f}  loss {row['test_loss']:.4f}" if "test_acc" in row else ""
        self.run_dir.log(
            f"round {rnd + 1}/{self.cfg.train.rounds}{acc}  train_loss {row['train_loss']:.4f}  "
            f"{t['round']:.2f} s (down {t['downlink']:.3f}, train {t['local_training']:.2f}, "
            f"up {t['uplink']:.3f}, eval {t.get('evaluation', 0.0):.2f})")

    def _oldest_resume_round(self, rnd: int) -> int:
        """The earliest round a resume could start at: the oldest checkpoint on disk, or (with none)
        a checkpoint written after this round."""
        kept = checkpoint.all_checkpoints(self.run_dir.checkpoints)
        return checkpoint.rounds_done(kept[0]) if kept else rnd + 1

    def _stop_now(self) -> bool:
        return stop_requested() or self.worker_stop

    def _broadcast_stop(self) -> None:
        self.world.sync("start of round")
        self.world.bcast_object(RoundPlan(round=-1, lr=0.0, stop=True))
        self.usage = self.world.gather_object(usage())

    def checkpoint(self, rounds_done: int) -> None:
        payload = {
            "rounds_done": rounds_done,
            "global_floats": self.global_floats.cpu(),
            "global_ints": self.global_ints.cpu(),
            "algorithm": self.algo.state_dict(),
            "metrics": self.metrics,
            "config": self.cfg_dict,
            "config_math": math_fingerprint(self.cfg_dict),
            "elapsed_s": self.elapsed(),
        }
        self.last_checkpoint = checkpoint.save(self.run_dir.checkpoints, rounds_done, payload, self.cfg.run.keep_checkpoints)
        self.last_checkpoint_round = rounds_done
        self.run_dir.write_json("status.json", {"state": "running", "rounds_done": rounds_done,
                                                "checkpoint": str(self.last_checkpoint)})

    def _restore(self, state: dict[str, Any]) -> None:
        self.global_floats = state["global_floats"].to(self.device)
        self.global_ints = state["global_ints"].to(self.device)
        self.metrics = state["metrics"]
        self.start_round = state["rounds_done"]
        self.last_checkpoint_round = state["rounds_done"]
        self.last_checkpoint = checkpoint.path_for(self.run_dir.checkpoints, state["rounds_done"])
        self.elapsed_before = state["elapsed_s"]
        self.run_dir.write_rows("metrics.jsonl", self.metrics)
        self.run_dir.keep_rounds("clients.jsonl", self.start_round)

    def elapsed(self) -> float:
        """Wall time of the run so far, across resumes."""
        return self.elapsed_before + time.perf_counter() - self.started

    def describe_checkpoint(self) -> str:
        if self.last_checkpoint is None:
            return " No checkpoint was written yet (see run.checkpoint_every)."
        return (f" Last checkpoint: {self.last_checkpoint} (after round {self.last_checkpoint_round}); "
                f"continue with: --resume {self.run_dir.path}")

    def _save_model(self) -> None:
        flat = self.tools.flat
        flat.load(self.global_floats, self.global_ints)
        buf = io.BytesIO()
        torch.save(flat.model.state_dict(), buf)
        atomic_write(self.run_dir.path / "model.pt", buf.getvalue())

    def _write_summary(self, rounds_done: int, status: str) -> None:
        evaluated = [r for r in self.metrics if "test_acc" in r]
        best = max(evaluated, key=lambda r: r["test_acc"], default=None)
        summary = {
            "status": status,
            "rounds_done": rounds_done,
            "rounds": self.cfg.train.rounds,
            "algorithm": self.cfg.algorithm.name,
            "dataset": self.cfg.data.dataset.name,
            "final_test_acc": evaluated[-1]["test_acc"] if evaluated else None,
            "final_test_loss": evaluated[-1]["test_loss"] if evaluated else None,
            "best_test_acc": best["test_acc"] if best else None,
            "best_round": best["round"] if best else None,
            "forgetting": forgetting([r["per_class_acc"] for r in evaluated]),
            "wall_time_s": round(self.elapsed(), 2),
            "round_time_median_s": round(statistics.median(r["time"]["round"] for r in self.metrics), 4) if self.metrics else None,
            "checkpoint": str(self.last_checkpoint) if self.last_checkpoint else None,
            "first_round_started_at": self.first_round_at,
            "peak_rss_mb_per_rank": [round(rss, 1) for rss, _ in self.usage],
            "cpu_s_per_rank": [round(cpu, 2) for _, cpu in self.usage],
        }
        self.run_dir.write_json("summary.json", summary)
        self.run_dir.write_json("status.json", {"state": status, "rounds_done": rounds_done,
                                                "checkpoint": summary["checkpoint"]})
        if evaluated:
            self.run_dir.log(f"[mpifed] {status}: {rounds_done} rounds, final test accuracy {summary['final_test_acc']:.4f} "
                             f"(best {summary['best_test_acc']:.4f} at round {summary['best_round']}), "
                             f"wall time {summary['wall_time_s']:.1f} s; results in {self.run_dir.path}")
