"""Where device memory outside the allocator appears while a GPT-2-shaped model loads
and runs, under PyTorch's own allocator (no Reservoir): after each module of a forward,
and after a forward on a second stream, the device memory in use minus what the
allocator reserved since the start, with the context's stack-size limit. It shows
what a baseline taken before the model's first work misses (docs/sleep.md, Figures).

    python3 tests/python/gpu/outside_memory_probe.py [LAYERS]

Prints one JSON line: "stages" (stage, MiB outside the allocator, stack limit) and
"jumps" (the module after which 1 MiB or more appeared, its type, the MiB).
"""

import ctypes
import json
import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sleep_worker import start_process  # noqa: E402

MiB = 1 << 20


def stack_limit(cuda):
    value = ctypes.c_size_t(0)
    cuda.cuCtxGetLimit(ctypes.byref(value), 0)  # CU_LIMIT_STACK_SIZE
    return value.value


def main():
    layers = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    cuda = ctypes.CDLL("libcuda.so.1")
    start_process()  # the sleep worker's baseline, taken the same way
    free0 = torch.cuda.mem_get_info()[0]
    reserved0 = torch.cuda.memory_reserved()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "stages": [], "jumps": []}
    last = [0.0]

    def outside():
        torch.cuda.synchronize()
        used = free0 - torch.cuda.mem_get_info()[0]
        return (used - (torch.cuda.memory_reserved() - reserved0)) / MiB

    def note(stage):
        out["stages"].append((stage, outside(), stack_limit(cuda)))

    config = GPT2Config(n_layer=layers, n_embd=768, n_head=12, n_positions=1024,
                        vocab_size=50257)
    note("start")
    model = GPT2LMHeadModel(config).cuda().eval()
    note("loaded")

    def hook(name):
        def after(module, inputs, result):
            now = outside()
            if now - last[0] >= 1.0:
                out["jumps"].append((name, type(module).__name__, round(now - last[0], 1)))
            last[0] = now
        return after

    for name, module in model.named_modules():
        module.register_forward_hook(hook(name))
    prompt = torch.randint(0, config.vocab_size, (1, 64), device="cuda")
    with torch.no_grad():
        model(prompt, use_cache=False)
    note("one forward")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        model(prompt, use_cache=False)
    torch.cuda.current_stream().wait_stream(side)
    note("forward on a side stream")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
