"""How the threads of one parallel region share its work (numba): claim hands out chunk numbers from a shared
counter, one at a time, to whichever thread comes free; count_done, publish and published let a thread wait for a
result another thread made in the same region (matvec.expert_ffn_int8); counters makes the counters.
Intrinsics and a helper that the CPU kernels inline: see kernels/cpu/cache.py."""
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from kernels.cpu.types import fast

# numba's cache keys these kernels on this file alone: kernels/cpu/cache.py says how edits to the modules they
# inline reach them (INLINED, INLINED_DIGEST, checked by tests/kernels/test_cpu_cache.py)
INLINED = ("types",)
INLINED_DIGEST = "330468d6e679d23c"


@intrinsic
def claim(typingctx, counter):
    """The next chunk number: counter[0] before an atomic add of 1 (counter: int64 [1], zero when the region
    starts; the threads share it)."""
    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        return builder.atomic_rmw("add", data, ir.Constant(ir.IntType(64), 1), "monotonic")
    return types.int64(counter), codegen


@intrinsic
def count_done(typingctx, counts, i):
    """counts[i] before an atomic add of 1 that publishes this thread's writes with it and sees those of every
    thread that counted before (acq_rel): the thread that counts a task's last part sees all its parts' results."""
    def codegen(context, builder, sig, args):
        return builder.atomic_rmw("add", _at(context, builder, sig, args), ir.Constant(ir.IntType(64), 1), "acq_rel")
    return types.int64(counts, i), codegen


@intrinsic
def publish(typingctx, flags, i):
    """flags[i] = 1 after this thread's writes (a release store): a thread that reads it with published sees them."""
    def codegen(context, builder, sig, args):
        builder.store_atomic(ir.Constant(ir.IntType(64), 1), _at(context, builder, sig, args), "release", 8)
        return context.get_dummy_value()
    return types.none(flags, i), codegen


@intrinsic
def published(typingctx, flags, i):
    """Whether flags[i] was published (an acquire load: the publisher's writes before it are seen after)."""
    def codegen(context, builder, sig, args):
        value = builder.load_atomic(_at(context, builder, sig, args), "acquire", 8)
        return builder.icmp_signed("!=", value, ir.Constant(ir.IntType(64), 0))
    return types.boolean(flags, i), codegen


def _at(context, builder, sig, args):
    """The address of a[i] for an intrinsic's (a: int64 1-d array, i) arguments."""
    i = context.cast(builder, args[1], sig.args[1], types.int64)
    return builder.gep(context.make_array(sig.args[0])(context, builder, args[0]).data, [i])


@fast
def counters(n):
    """int64 [n] zeros (claim's counter, count_done's counts): made outside the kernel's parallel region, since
    np.zeros in a function with parallel=True becomes a parallel loop of its own, one more region to start and join
    (numba's parallel_diagnostics list it) before the kernel's."""
    return np.zeros(n, np.int64)
