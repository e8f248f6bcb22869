"""The one-shot engine: a queue and thread per one-shot model (embeddings,
rerank, classify, speech recognition). `queue` - `OneShotQueue`, what callers
submit to; `plan` - which waiting items make the next dispatch and its groups;
`stats` - its counters and rates."""
