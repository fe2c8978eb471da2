#!/usr/bin/env bash
# The CUDA backend on a machine with an NVIDIA GPU (PyTorch and CuPy installed there):
#   pip install -e '.[test,cuda]' torch && bash bench/gpu_check.sh
# It has never run: no machine of this project has a GPU (see README, device table).
# 1. the CUDA and array-API tests; 2. the conformance kit on cuda in strict mode;
# 3. the ONNX conformance suite on cuda,cpu; 4. ResNet-50 (batch 1, 32) and a BERT-base-sized
# encoder (batch 32, sequence 128) against PyTorch eager on the same GPU and weights, and a
# CUDA-graph replay of one partition (bench/gpu_compare.py prints the table).
set -euo pipefail
cd "$(dirname "$0")/.."

python -c "import cupy, torch; assert torch.cuda.is_available(), 'no GPU for PyTorch'; \
print('CuPy', cupy.__version__, '| torch', torch.__version__, '|', torch.cuda.get_device_name(0))"
anychip devices | grep -E '^(device|cuda)'
python -c "import anychip; ok, why = anychip.core.plugin.host.get_registry().backends['cuda'].available(); \
assert ok, why"

echo "== tests: backends/cuda, backends/arrayapi"
python -m pytest tests/backends/cuda tests/backends/arrayapi -n 0 -q -m 'slow or not slow'

echo "== conformance kit, cuda, strict"
anychip conformance --device cuda --strict --json /tmp/anychip-cuda-kit.json || true

echo "== ONNX conformance suite on cuda,cpu"
ANYCHIP_CONFORMANCE_DEVICES=cuda,cpu python -m pytest tests/test_onnx_backend.py -q -n 2 || true

echo "== anychip on cuda vs PyTorch eager"
python bench/gpu_compare.py --repeat 10

# IREE's GPU targets beside CuPy's cuda (pip install '.[iree]'): vulkan (the GPU's own Vulkan
# driver), iree-cuda, iree-hip (pass --iree-hip-target through device_options where needed).
# Never run on a hardware GPU (README, device table).
for dev in vulkan iree-cuda iree-hip; do
    if anychip devices | grep -E "^$dev +[a-z-]+ +yes" >/dev/null; then
        echo "== $dev: tests, conformance kit (strict), ONNX suite on $dev,cpu"
        python -m pytest tests/backends/iree -n 0 -q -m 'slow or not slow' || true
        anychip conformance --device "$dev" --strict --json "/tmp/anychip-$dev-kit.json" || true
        ANYCHIP_CONFORMANCE_DEVICES="$dev,cpu" python -m pytest tests/test_onnx_backend.py -q -n 2 || true
    else
        echo "== $dev: not available here: $(anychip devices | grep -E "^$dev " || echo 'not listed')"
    fi
done
