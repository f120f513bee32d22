#!/usr/bin/env bash
# Type-checks the Metal host runtime (include/chroma/metal/host.h) against Apple's real metal-cpp
# headers, on Linux, where there is neither Metal nor the Apple system headers metal-cpp
# includes (docs/cuda.md, "Metal").
#
#   scripts/metal_typecheck.sh METAL_CPP_DIR     # the unpacked metal-cpp (holds Metal/Metal.hpp)
#
# metal-cpp comes from Apple (developer.apple.com/metal/cpp), not from a package registry, so CI
# cannot run this; tests/python/test_metal_host.py runs the runtime against a stand-in with the
# same signatures instead. The few Apple system headers metal-cpp includes (the Objective-C
# runtime, CoreFoundation, IOSurface, dispatch) are replaced by declarations of the types and
# functions it names, written to a temporary directory: enough for clang to check every metal-cpp
# call the runtime makes (names, argument and result types, const-ness) with the implementation
# macros defined, as the generated host source defines them. It prints clang's diagnostics for
# host.h and exits nonzero on any error.
set -euo pipefail

cpp="${1:?usage: scripts/metal_typecheck.sh METAL_CPP_DIR}"
[ -f "$cpp/Metal/Metal.hpp" ] && [ -f "$cpp/Foundation/Foundation.hpp" ] || {
  echo "metal_typecheck: $cpp has no Metal/Metal.hpp and Foundation/Foundation.hpp (metal-cpp)" >&2
  exit 2
}
root="$(cd "$(dirname "$0")/.." && pwd)"
clang="$(command -v clang++-14 || command -v clang++ || true)"
[ -n "$clang" ] || { echo "metal_typecheck: clang++ is not installed" >&2; exit 2; }
shim="$(mktemp -d)"
trap 'rm -rf "$shim"' EXIT
mkdir -p "$shim/objc" "$shim/CoreFoundation" "$shim/IOSurface" "$shim/dispatch"
cat >"$shim/objc/runtime.h" <<'EOF'
#pragma once
#include <stddef.h>
#include <stdint.h>
typedef struct objc_class* Class;
struct objc_object { Class isa; };
struct objc_class { Class isa; };
typedef struct objc_object* id;
typedef struct objc_selector* SEL;
typedef signed char BOOL;
typedef struct objc_object Protocol;
extern "C" Class objc_lookUpClass(const char*);
extern "C" SEL sel_registerName(const char*);
extern "C" Protocol* objc_getProtocol(const char*);
EOF
cat >"$shim/objc/message.h" <<'EOF'
#pragma once
#include <objc/runtime.h>
extern "C" void objc_msgSend(void);
extern "C" void objc_msgSend_stret(void);
extern "C" void objc_msgSend_fpret(void);
EOF
cat >"$shim/dispatch/dispatch.h" <<'EOF'
#pragma once
typedef struct dispatch_data_s* dispatch_data_t;
typedef struct dispatch_queue_s* dispatch_queue_t;
EOF
cat >"$shim/CoreFoundation/CoreFoundation.h" <<'EOF'
#pragma once
#include <dispatch/dispatch.h>
#include <math.h>
#include <stdint.h>
typedef double CFTimeInterval;
typedef long CFIndex;
typedef const void* CFTypeRef;
typedef struct __CFString* CFStringRef;
EOF
echo 'typedef struct __IOSurface* IOSurfaceRef;' >"$shim/IOSurface/IOSurfaceRef.h"
: >"$shim/TargetConditionals.h"
cat >"$shim/check.cpp" <<'EOF'
#define NS_PRIVATE_IMPLEMENTATION
#define MTL_PRIVATE_IMPLEMENTATION
#include "chroma/metal/host.h"
extern "C" const char chroma_metal_source[] = "";
EOF
# Warnings inside metal-cpp itself are not ours: only host.h's diagnostics count.
out="$("$clang" -std=c++20 -fblocks -fsyntax-only -Wall -Wextra -I"$root/include" -I"$cpp" -I"$shim" "$shim/check.cpp" 2>&1 || true)"
errors="$(printf '%s\n' "$out" | grep -c 'error:' || true)"
printf '%s\n' "$out" | grep -A3 'chroma/metal/host.h:[0-9]*:[0-9]*: ' || true
if [ "$errors" != 0 ]; then
  printf '%s\n' "$out" | head -40
  echo "metal_typecheck: $errors error(s)" >&2
  exit 1
fi
echo "metal_typecheck: include/chroma/metal/host.h type-checks against $cpp"
