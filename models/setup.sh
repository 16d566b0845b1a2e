#!/bin/sh
# Debian packages the training needs: torch, a threaded OpenBLAS (torch's matmuls run
# far faster with it than with the reference BLAS) and the King James Bible corpus.
set -e
apt-get update
apt-get install -y python3-torch libopenblas0-pthread bible-kjv
