// Host emulations (host_emu.py): the C++ headers, before the kernel's prelude (its one-letter
// shape macros H, W, K, ... must not reach them).

#include <atomic>
#include <barrier>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <vector>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
