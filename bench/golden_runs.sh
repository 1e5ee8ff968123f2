#!/bin/bash
# Golden cases: short language-model runs whose final weights, optimizer state and metrics (timings
# dropped) are hashed, so two checkouts can be compared bit for bit (a refactor must not change them).
#
#   bench/golden_runs.sh REPO OUT     # REPO: a checkout (e.g. a `git worktree add /tmp/base <commit>`)
#   diff <(bench/golden_runs.sh /tmp/base /tmp/g1 | grep -v exit) <(bench/golden_runs.sh . /tmp/g2 | grep -v exit)
#
# The three: GRPO with an SFT warm start; GAE with a critic and the KL in the reward (log-probs
# recomputed); RLOO with 2 epochs x 2 mini-batches. The reward is `length` from the first token (-0.01 a
# token): a tiny model never answers the arithmetic, and a 0/1 reward would leave every group equal and no
# step updating the policy (the lines say how many did: every one, with this reward).
# PY: the interpreter (default: this checkout's .venv, where the command is run from)
PY=${PY:-$(pwd)/.venv/bin/python}
REPO=$(cd "$1" && pwd); OUT=$2; rm -rf "$OUT"; mkdir -p "$OUT"; cd "$OUT" || exit 1
export PYTHONPATH=$REPO
common="run.time_limit_s=null logging.progress=false logging.tensorboard=false logging.plot=[] run.threads=1
data.eval_size=32 sft.max_steps=30 sft.val_size=32 data.prompts_per_step=8
reward.fn=length reward.args.target=0 reward.args.coef=0.01"
run() { name=$1; shift; $PY -m hone.cli train run.dir="$OUT" run.name="$name" $common "$@" > "$OUT/$name.out" 2>&1; echo "$name exit $?"; }
run grpo run.steps=4 run.save_every=2
run gae run.steps=3 run.save_every=3 algorithm.advantage=gae "critic={}" algorithm.kl.coef=0.05 \
  algorithm.kl.placement=reward algorithm.old_log_probs=recompute
run rloo run.steps=3 run.save_every=3 algorithm.advantage=rloo trainer.mini_batches=2 trainer.ppo_epochs=2 \
  algorithm.skip_zero_variance_groups=false
for d in grpo gae rloo; do
  ck=$(ls -d "$OUT/$d"/checkpoints/step-* 2>/dev/null | sort -V | tail -1)
  echo "$d weights $(cat "$ck"/model/*.safetensors 2>/dev/null | sha256sum | cut -c1-16)" \
    "optimizer $(sha256sum "$ck/optimizer.pt" 2>/dev/null | cut -c1-16)" \
    "$(grep -o '([0-9]* of [0-9]* steps updated the policy' "$OUT/$d.out" | tail -1)"
  $PY - "$OUT/$d/metrics.jsonl" "$d" <<'PY'
import hashlib, json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
timing = ("time/", "throughput")
rows = [{k: v for k, v in r.items() if not k.startswith(timing) and "per_s" not in k and not k.endswith("_s")} for r in rows]
print(sys.argv[2], "metrics", hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16], len(rows))
PY
done
