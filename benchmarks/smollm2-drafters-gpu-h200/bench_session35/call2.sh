#!/usr/bin/env bash
# GPU call 2 of 3: stash the second GGUF piece, CORAL and HASS.
set -u; W=/root/work; mkdir -p $W/d; cp .gpu/g2/gpart01 $W/ && cp -r .gpu/d/coral .gpu/d/hass $W/d/ && ls -la $W $W/d
