"""The step engine: what one generative model's step thread owns.

* `worker` - `StepWorker`, the step thread and its loop (schedule, execute,
  update);
* `scheduler` - `Scheduler`, pure: plans a step, applies what it did; with
  `sequence` (the sequences and their table), `kv_slots` (slots, the prefix
  cache, the plan under construction), `batch_policy` and `step_model` (how
  much batch work a step takes), `speculation` (drafts), `output` and
  `output_processor` (text, stops, token events), `counters`;
* `prefix_disk` - the prefix cache's disk tier;
* `stats` and `queue_count` - what the step thread publishes;
* `faults` - a backend wrapper that fails the steps it is told to.

`engine.engine.Engine` is the asyncio facade the layers above hold."""
