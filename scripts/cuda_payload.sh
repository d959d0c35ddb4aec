#!/bin/bash
# Packs MLX's CUDA backend and what mlxchat needs beside the packages of a CUDA machine's image (Python 3.12,
# x86-64, with numpy, transformers, tokenizers, scipy, pytest already there) into .whl/p1, p2, p3: parts of
# one xz archive of a site folder, each small enough to travel beside the working tree to a machine that
# cannot reach a registry. docs/cuda.md says how the parts are sent and run (scripts/cuda_check.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
MLX=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('mlx'))")
MLX_LM=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('mlx-lm'))")
PLATFORMS=""
for p in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 \
         manylinux_2_5 manylinux1; do PLATFORMS+=" --platform ${p}_x86_64"; done
rm -rf .whl/deps .whl/site && mkdir -p .whl/deps .whl/site
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp $PLATFORMS -d .whl/deps \
  "mlx==$MLX" "mlx-cuda-13==$MLX" "mlx-lm==$MLX_LM" fastapi uvicorn httptools sse-starlette prometheus-client \
  "llguidance>=1.9,<2" "mcp>=2,<3" textual openai
# What the image lacks (its own numpy, transformers, tokenizers, huggingface-hub, scipy... are kept).
for name in mlx mlx_cuda_13 mlx_lm fastapi starlette pydantic pydantic_core annotated_types annotated_doc \
    typing_inspection uvicorn httptools sse_starlette llguidance mcp mcp_types python_multipart jsonschema \
    jsonschema_specifications referencing rpds_py opentelemetry_api pyjwt cryptography textual platformdirs \
    mdit_py_plugins linkify_it_py openai jiter httpx2 httpcore2 sniffio truststore typing_extensions anyio h11 \
    click rich markdown_it_py mdurl pygments prometheus_client; do
  for wheel in .whl/deps/${name}-[0-9]*.whl; do
    [ -e "$wheel" ] && unzip -q -o "$wheel" -d .whl/site
  done
done
strip --strip-unneeded .whl/site/mlx/lib/libmlx.so
echo "packing $(du -sh .whl/site | cut -f1) (xz -9e: a few minutes)"
tar cf - -C .whl/site . | xz -9e -T2 > .whl/site.tar.xz
rm -f .whl/p1 .whl/p2 .whl/p3 && split -b 29000000 -d -a 1 .whl/site.tar.xz .whl/part
mv .whl/part0 .whl/p1 && mv .whl/part1 .whl/p2 && mv .whl/part2 .whl/p3
ls -l .whl/p1 .whl/p2 .whl/p3
