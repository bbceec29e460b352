"""Runs of decode steps applied at once: the twin's speed-up, with step-by-step results.

Most of a simulated server's steps decode one token of every running request while nothing
else happens: no arrival, no load, no sample comes before the step ends, nothing is loaded
and the queue's head (if any) does not fit. Such a step is the previous one again with one
more token of KV per request. A `DecodeRun` applies those steps without an event each, and
keeps the requests' own counts as they were at its start until it stops (they are the same
for every request: computed, generated tokens and blocks grow by the steps done), so a step
costs O(1) rather than O(running requests).

What the run does at each step end (t is the step's end; the engine hands it `limit_s`,
`inclusive` from `EventQueue.step_end_limit`: the step end is the next event while
t < limit_s, or t == limit_s and `inclusive`):

* a step whose end is not the next event suspends the run with that step in progress
  (`advance` returns "in_progress"), and the engine queues its end as usual. If that end is
  the next event for the server, the engine resumes the run (`advance(..., resume=True)`):
  in a fleet, the other servers' step ends come between, and each step costs O(1) still.
  Anything else that reads or changes the server first (an arrival for it, a load or
  lookup reply, a sample, the end of the run) makes the engine `settle` the run: the
  requests' counts are written back, the plan is the step's, and the step ends as any;
* requests whose last token this step samples finish with it: the run writes their counts
  back, releases them as `Scheduler.complete` does and returns them ("completed"); the
  engine records them and issues their sessions' next turns, then calls `advance` again,
  which plans the next step first;
* planning the next step allocates the blocks the requests grow into (request r with c
  computed tokens and b blocks at the start needs one in step b x bt - c + 1 of the run,
  and every bt steps after that; allocating and evicting them step by step is the same as
  request by request) and retries the queue's head (`Scheduler.admission`; while the
  stores do not change, its answer stands, and GPU blocks only get fewer). If a block
  cannot be had without a preemption, or the head would be admitted, or no request is left,
  the run writes the counts back and returns "replan": the engine plans that step step by
  step.

Commits of full blocks are written back once, when a request's counts are: the run's
preconditions (`Scheduler.decode_run`) make every request's next blocks go to a segment only
it holds, cached up to its committed blocks, so a commit changes no block count in between.
tests/engines/sim/test_decode_runs.py compares whole runs with the step-by-step loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from kvrepro.engines.sim.entities import Request

if TYPE_CHECKING:
    from kvrepro.engines.sim.scheduler import Admission, Scheduler, StepPlan

Outcome = Literal["in_progress", "completed", "replan"]


class DecodeRun:
    """The decode steps after `plan` (step 1, from `start_s` to `end_s`) on `sched`."""

    def __init__(self, sched: Scheduler, plan: StepPlan, step_s: tuple[float, float],
                 finish_steps: list[tuple[int, int]], grow_steps: list[int], c0_sum: int):
        """`plan` is step 1, from step_s[0] to step_s[1]; `finish_steps`: (the step whose end
        finishes running request i, i); `grow_steps[i]`: the first step in which request i
        needs a new block (see the module doc); `c0_sum`: their computed tokens."""
        self.sched, self.plan = sched, plan
        self.start_s, self.end_s = step_s  # of the step in progress, number `step`
        self.step, self.duration_s = 1, plan.duration_s
        self.requests = list(sched.running)  # in running order, as at the start
        self.c0_sum = c0_sum
        finish_steps.sort()
        self.finishes, self.next_finish = finish_steps, 0
        self.grow_first = grow_steps
        self.grows = sorted(zip(grow_steps, range(len(grow_steps)), strict=True))
        self.grow_added, self.grow_live = 0, [True] * len(grow_steps)
        self.by_residue = [0] * sched.block_tokens
        self.changed = self.ended = False  # ended: the step `step` has ended, none planned
        self.steps_planned = self.tokens_generated = 0
        self.busy_s = 0.0  # the planned steps' durations (host_cpu's accounting)
        self._set_batch()

    def _set_batch(self) -> None:
        """Per batch: its size, the step-time function, and the head the scheduler tries."""
        sched = self.sched
        self.batch = batch = len(sched.running)
        self.budget = sched.max_num_batched_tokens - batch
        self.decode_step_s = sched.timer.decode_step_fn(batch) if batch else None
        host = sched.timer.host_stretch
        self.connector_s = sched.connector_s[0] * host
        self.request_s = sched.connector_s[1] * batch * host
        self._set_head()

    def _set_head(self) -> None:
        """The queue's head the scheduler tries at the next step (None: the queue is empty,
        or no budget or seat is left). A head whose asynchronous lookup has no answer by
        then (it arrived during the run) makes that step step by step (`replan_next`): the
        scheduler sends its lookup."""
        sched = self.sched
        self.head = head = (sched.waiting[0] if sched.waiting and self.budget > 0
                            and self.batch < sched.max_num_seqs else None)
        self.keep = set(head.segment_numbers) if head is not None else set()
        self.adm: Admission | None = None
        self.replan_next = head is not None and not sched.lookup_answered(head, self.end_s)

    # ------------------------------------------------------------------ stepping

    def advance(self, limit_s: float, inclusive: bool,
                resume: bool = False) -> tuple[Outcome, list[Request]]:
        """Plan and end steps while their ends are the next events (after "completed", the
        engine calls it again, which first plans the next step); see the module doc for the
        outcomes. `resume`: the step in progress ends now (the engine popped its end: the run
        was suspended, `settle`). The loop keeps its state in locals: it runs once per
        simulated step."""
        if self.head is None and self.sched.waiting:  # a request arrived while suspended
            self._set_head()
        bt, gpu, by_residue = self.sched.block_tokens, self.sched.gpu, self.by_residue
        grows, live, n_grows = self.grows, self.grow_live, len(self.grows)
        step, start_s, end_s, duration_s = self.step, self.start_s, self.end_s, self.duration_s
        batch, c0_sum, head = self.batch, self.c0_sum, self.head
        decode_step_s, connector_s = self.decode_step_s, self.connector_s
        request_s, added, ended = self.request_s, self.grow_added, self.ended
        next_grow = grows[added][0] if added < n_grows else 1 << 62
        next_finish = (self.finishes[self.next_finish][0]
                       if self.next_finish < len(self.finishes) else -1)
        tokens = planned = 0
        busy_s = 0.0
        outcome: Outcome = "in_progress"
        while True:
            if ended:  # plan step `nxt` at end_s, as the scheduler would
                nxt = step + 1
                while next_grow <= nxt:
                    by_residue[next_grow % bt] += live[grows[added][1]]
                    added += 1
                    next_grow = grows[added][0] if added < n_grows else 1 << 62
                need = by_residue[nxt % bt]
                if not batch or self.replan_next \
                        or (head is not None and not self._head_waits(need, end_s)) \
                        or (need and not gpu.allocate(need)):
                    outcome = "replan"  # admission, preemption or no request: step by step
                    break
                if self.adm is not None and self.adm.refused:
                    self.sched.offload.refuse_prefetch(self.adm.refused, end_s)
                planned += 1
                # = Scheduler._duration_s([], kv, 0.0, batch, batch): the same float operations
                duration_s = decode_step_s(c0_sum + batch * nxt) + connector_s + request_s
                busy_s += duration_s
                start_s, end_s, step, ended = end_s, end_s + duration_s, nxt, False
            if resume:
                resume = False  # its end was the event being handled
            elif not (end_s < limit_s or (end_s == limit_s and inclusive)):
                break  # something else comes first: the step stays in progress
            tokens += batch  # the step ends: one token of each running request
            ended = True
            if step == next_finish:
                outcome = "completed"
                break
        self.step, self.start_s, self.end_s, self.duration_s = step, start_s, end_s, duration_s
        self.grow_added, self.ended = added, ended
        self.tokens_generated += tokens
        self.steps_planned += planned
        self.busy_s += busy_s
        self.changed = self.changed or planned > 0
        if outcome == "completed":
            return outcome, self._finish()
        if outcome == "replan":
            self._write_back(step if ended else step - 1, planned=not ended)
        return outcome, []

    def settle(self) -> None:
        """Write the run's state back to the scheduler (the requests' counts, the counters,
        the plan of the step in progress), as step by step would have left it; after an
        "in_progress" outcome, before anything else reads or changes the server (the engine
        calls this: an arrival, a load, a sample, the end). The run is done with then."""
        self._write_back(self.step if self.ended else self.step - 1, planned=not self.ended)

    def _head_waits(self, need: int, now_s: float) -> bool:
        """Whether the queue's head still does not fit when the next step is planned at
        `now_s` with `need` more blocks for the running requests (its lookup's refusal, if
        any, is counted by the caller); False also when the blocks could only be had by
        evicting the head's own cached blocks (then the run stops)."""
        sched, gpu, head = self.sched, self.sched.gpu, self.head
        if need and not gpu.can_allocate(need, self.keep):
            return False
        if self.adm is None or not sched.admission_stands(head, now_s):
            self.adm = sched.admission(head, now_s, self.budget)
            if self.adm.need <= gpu.available_blocks(head.segment_numbers) - need:
                sched.admission_hint = (head, now_s, self.budget, self.adm)
                return False  # the scheduler admits it here (with this admission)
        # else: the same answer, and blocks only get fewer in a run: it still waits
        return True

    def _finish(self) -> list[Request]:
        """The step in progress ended finishing some requests: write them back, release
        them (`Scheduler.complete`'s order: in running order, then the running list)."""
        sched, step, finishes = self.sched, self.step, self.finishes
        done: list[int] = []
        while self.next_finish < len(finishes) and finishes[self.next_finish][0] == step:
            done.append(finishes[self.next_finish][1])
            self.next_finish += 1
        done.sort()
        finished = [self.requests[i] for i in done]
        bt = sched.block_tokens
        for i, req in zip(done, finished, strict=True):
            self.c0_sum -= req.computed_tokens
            first = self.grow_first[i]
            if first <= step:  # counted in by_residue (added up to the step planned last)
                self.by_residue[first % bt] -= 1
            self.grow_live[i] = False
            self._write_back_one(req, step, planned=False)
        self.flush_counters()
        sched.finish(finished, self.end_s)
        self.changed = True
        self._set_batch()
        return finished

    # ------------------------------------------------------------------ writing back

    def _write_back(self, steps: int, planned: bool) -> None:
        """Counts of the running requests after `steps` ended steps (with the next one's
        blocks when `planned`), the counters, and the plan of the step in progress."""
        if not (steps or self.changed):
            return  # nothing happened: the plan and the counts are the scheduler's
        for req in self.sched.running:
            self._write_back_one(req, steps, planned)
        self.flush_counters()
        if planned and self.changed:
            plan, running = self.plan, self.sched.running
            plan.requests, plan.tokens, plan.prefill_chunks = list(running), [1] * len(running), []
            plan.kv_tokens = self.c0_sum + self.batch * self.step
            plan.duration_s, plan.load_wait_s, plan.lookup_wait_s = self.duration_s, 0.0, 0.0

    def _write_back_one(self, req: Request, steps: int, planned: bool) -> None:
        """One request after `steps` whole decode steps of the run: tokens computed and
        generated, blocks grown (to hold the next token when `planned`), blocks committed."""
        bt = self.sched.block_tokens
        c = req.computed_tokens = req.computed_tokens + steps
        req.generated_tokens += steps
        req.blocks = max(req.blocks, -(-(c + planned) // bt))
        full = c // bt
        if full > req.committed_blocks:
            self.sched.gpu.commit(req.block_ranges, req.committed_blocks, full)
            req.committed_blocks = full

    def flush_counters(self) -> None:
        """Add the tokens generated and steps planned so far to the server's counters (a
        sample reads them while the run is suspended; nothing else it reads is held back:
        blocks are allocated as steps are planned, and no store is written)."""
        counters = self.sched.counters
        counters.generation_tokens += self.tokens_generated
        self.sched._count_step(self.busy_s, self.batch, self.steps_planned)
        self.tokens_generated = self.steps_planned = 0
        self.busy_s = 0.0
