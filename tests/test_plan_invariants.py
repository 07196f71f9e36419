"""Invariants of the CUDA planner (csrc/linrec/cuda/plan.h) over a grid of problems, checked on the
host with the system compiler like tests/test_plan_host.py (no GPU needed): whatever rule picks a
plan, the launcher must be able to run it and it must cover every step. The program prints one
line per violation, then the number of problems it planned."""
import pytest

from test_plan_host import CXX, _run_program

_INVARIANTS_PROGRAM = r"""
#include <cstdio>
#include "linrec/cuda/plan.h"
using namespace linrec;

static int bad = 0;
static long long planned = 0;
#define CHECK(cond, ...) do { if (!(cond)) { ++bad; std::printf("%s: ", #cond); std::printf(__VA_ARGS__); std::printf("\n"); } } while (0)

alignas(16) static char buf[64];

// (rows, len) innermost (`channels` == 0) or (rows, len, channels) with the scan along len; `shift`
// elements off the 16-byte grid; `reverse`: walked from each row's last step.
static ScanParams problem(int elem, bool bwd, bool det, long long rows, long long len, long long channels, int shift,
                          bool reverse) {
  ScanParams p{};
  p.backward = bwd;
  p.deterministic = det;
  p.len = len;
  if (channels == 0) {
    p.num_seq = rows; p.nbatch = 1; p.bsize[0] = rows;
  } else {
    p.num_seq = rows * channels; p.nbatch = 2; p.bsize[0] = channels; p.bsize[1] = rows;
  }
  for (int s = 0; s < kNumSlots; ++s) {
    const bool batch = is_batch_slot(s);
    if (channels == 0) {
      p.lstride[s] = batch ? 0 : (reverse ? -1 : 1);
      p.bstride[s][0] = batch ? 1 : len;
    } else {
      p.lstride[s] = batch ? 0 : (reverse ? -channels : channels);
      p.bstride[s][0] = 1;
      p.bstride[s][1] = batch ? channels : len * channels;
    }
  }
  const long long last = reverse ? (len - 1) * (channels ? channels : 1) : 0;
  for (int s : {kIn, kCoeff, kOut})
    p.ptr[s] = buf + (shift + last) * elem;
  if (bwd)
    for (int s : {kGradIn, kGradCoeff}) p.ptr[s] = buf + (shift + last) * elem;
  return p;
}

static const char* name_of(const ScanPlan& plan, int elem) { return config_name(plan.kind, elem, plan.config); }

static void check(const ScanParams& p, int elem, const DeviceInfo& dev, const char* what) {
  ++planned;
  bool inapplicable = false;
  const ScanPlan plan = plan_scan(p, elem, dev, ConfigRequest{}, &inapplicable);
  CHECK(!inapplicable, "%s: the default plan reported inapplicable", what);
  CHECK(plan.grid > 0, "%s: empty grid", what);
  CHECK(config_applies(p, elem, dev, plan.kind, plan.config), "%s: default %s does not apply", what, name_of(plan, elem));
  if (plan.kind == ScanKind::kTile) {
    const int64_t tile = tile_config(elem, plan.config).tile();
    CHECK(plan.num_chunks * plan.per_chunk * tile >= p.len, "%s: %s covers %lld x %lld tiles", what,
          name_of(plan, elem), (long long)plan.num_chunks, (long long)plan.per_chunk);
    CHECK(plan.num_chunks == 1 || plan.per_chunk == 1, "%s: look-back blocks walk several tiles", what);
    CHECK(plan.grid == p.num_seq * plan.num_chunks, "%s: tile grid %lld", what, (long long)plan.grid);
  } else if (plan.kind == ScanKind::kStream) {
    CHECK(plan.num_chunks == ceil_div(p.len, stream_config(elem, plan.config).tile()), "%s: stream tiles", what);
    CHECK(plan.grid == p.num_seq, "%s: stream grid", what);
  } else if (plan.kind == ScanKind::kRing) {
    CHECK(plan.grid <= int64_t(dev.num_sms) * ring_config(elem, plan.config).blocks, "%s: ring grid", what);
  } else {
    const ChannelConfig cfg = channel_config(elem, plan.config);
    const int64_t items = ceil_div(p.num_seq, cfg.channels()) * plan.num_chunks;  // a block each
    CHECK(plan.num_chunks * plan.per_chunk * cfg.span() >= p.len, "%s: %s covers %lld x %lld spans", what,
          name_of(plan, elem), (long long)plan.num_chunks, (long long)plan.per_chunk);
    CHECK(plan.num_chunks == 1 || plan.per_chunk == 1, "%s: look-back blocks walk several spans", what);
    CHECK(plan.grid == items, "%s: channel grid %lld of %lld items", what, (long long)plan.grid, (long long)items);
  }
  const bool lookback = (plan.num_chunks > 1 && plan.kind != ScanKind::kStream) || plan.kind == ScanKind::kRing;
  CHECK(lookback == (plan.workspace_bytes > 0), "%s: workspace %zu", what, plan.workspace_bytes);
  CHECK(!(p.deterministic && lookback), "%s: look-back (%s) under deterministic algorithms", what, name_of(plan, elem));
  // every config by name: the plan runs it, or the request is reported inapplicable; a preference
  // runs it or yields to the default (the small stream blocks, or where it does not apply)
  for (ScanKind kind : kAllKinds)
    for (int i = 0; i < num_configs(kind); ++i) {
      const bool applies = config_applies(p, elem, dev, kind, i);
      bool flag = false;
      const ScanPlan named = plan_scan(p, elem, dev, ConfigRequest{kind, i, false}, &flag);
      CHECK(flag == !applies, "%s: %s inapplicable=%d, applies=%d", what, config_name(kind, elem, i), flag, applies);
      if (applies) {
        CHECK(named.kind == kind && named.config == i, "%s: by name %s ran %s", what, config_name(kind, elem, i),
              name_of(named, elem));
        CHECK(!(p.deterministic && named.kind == ScanKind::kTile && named.num_chunks > 1),
              "%s: %s by name chains look-back under deterministic algorithms", what, config_name(kind, elem, i));
      }
      const ScanPlan preferred = plan_scan(p, elem, dev, ConfigRequest{kind, i, true}, &flag);
      CHECK(!flag, "%s: a preference reported inapplicable", what);
      const bool as_default = preferred.kind == plan.kind && preferred.config == plan.config;
      CHECK(applies ? preferred.kind == kind && preferred.config == i : as_default, "%s: preferring %s ran %s", what,
            config_name(kind, elem, i), name_of(preferred, elem));
      const ScanPlan tuned = plan_scan(p, elem, dev, ConfigRequest{kind, i, true, true}, &flag);
      const bool small = plan.kind == ScanKind::kStream && plan.config == kStreamSmall;
      const bool ran = applies && !small ? tuned.kind == kind && tuned.config == i
                                         : tuned.kind == plan.kind && tuned.config == plan.config;
      CHECK(!flag && ran, "%s: a tuned %s ran %s (default %s)", what, config_name(kind, elem, i),
            name_of(tuned, elem), name_of(plan, elem));
    }
}

int main() {
  const DeviceInfo devices[] = {{132, 9, 232448, 25.4f}, {132, 9, 232448, 37.f}, {132, 9, 232448, 0.f},
                                {108, 8, 166912, 0.f}};
  const long long lens[] = {1, 2, 7, 16, 100, 512, 1000, 1024, 2048, 2056, 3000, 4096, 4608, 8000, 8001, 10000,
                            16384, 32768, 40000, 1 << 18};
  const long long rows_list[] = {1, 16, 132, 264, 500, 1000, 1100, 3200, 20000};
  char what[160];
  for (const DeviceInfo& dev : devices)
    for (int elem : {4, 2})
      for (bool bwd : {false, true})
        for (bool det : {false, true})
          for (bool reverse : {false, true})
            for (int shift : {0, 1})
              for (long long len : lens)
                for (long long rows : rows_list) {
                  if (rows * len > (1ll << 28)) continue;
                  std::snprintf(what, sizeof what, "cc%d dram%.0f e%d %s%s%s %lldx%lld shift%d", dev.cc_major,
                                dev.dram_gbps_per_sm, elem, bwd ? "bwd" : "fwd", det ? " det" : "",
                                reverse ? " rev" : "", rows, len, shift);
                  check(problem(elem, bwd, det, rows, len, 0, shift, reverse), elem, dev, what);
                  if (rows <= 16 && len >= 16 && len <= 8192)
                    for (long long channels : {64, 768, 1000}) {
                      std::snprintf(what, sizeof what, "cc%d e%d %s%s%s %lldx%lldx%lld shift%d", dev.cc_major, elem,
                                    bwd ? "bwd" : "fwd", det ? " det" : "", reverse ? " rev" : "", rows, len,
                                    channels, shift);
                      check(problem(elem, bwd, det, rows, len, channels, shift, reverse), elem, dev, what);
                    }
                }
  std::printf("planned %lld, violations %d\n", planned, bad);
  return 0;
}
"""


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_plan_invariants(tmp_path):
    """Over devices (H100, H200, unknown DRAM, Ampere), dtypes, directions, deterministic mode,
    reversed and off-grid rows, lengths 1 to 2^18, 1 to 20000 rows and (B, L, D) layouts: the
    default plan applies, covers every step, has a workspace exactly when it chains look-back and
    none under deterministic algorithms; every config by name runs as named or is reported
    inapplicable; a preference runs as named where it applies, else the default; a tuned choice
    likewise, except that it yields to the default's small stream blocks."""
    lines = _run_program(tmp_path, "invariants", _INVARIANTS_PROGRAM)
    assert lines[-1].startswith("planned ") and lines[-1].endswith("violations 0"), "\n".join(lines[:40])
    assert int(lines[-1].split()[1].rstrip(",")) > 5000
