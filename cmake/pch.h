// The one precompiled header: LibTorch dominates compile time (~17 s of parsing per TU).
#pragma once
#include <torch/torch.h>
