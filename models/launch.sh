#!/bin/sh
# Start both models in the background, one torch thread each, logging to models/.ckpt/<name>.log.
#   sh models/launch.sh --fresh     start over
#   sh models/launch.sh --resume    continue from models/.ckpt/<name>.pt
# Progress: tail -n 3 models/.ckpt/tiny-llama.log models/.ckpt/tiny-sinks.log
cd "$(dirname "$0")" || exit 1
mkdir -p .ckpt
for name in tiny-llama tiny-sinks; do
	OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 nohup /usr/bin/python3 train.py --name "$name" "$@" \
		>>".ckpt/$name.out" 2>&1 </dev/null &
	echo "$name: pid $!"
done
