// The mmap source's own read rate (issue 18 item 3): expert-sized ranges of a file, mapped read-only,
// copied into one staging buffer by stage_copy with 1, 2, 4, .. threads, as an expert cache fills its
// slots from a model larger than RAM. The first pass over the ranges takes the page faults (and, for a
// file on disk that is not in the page cache, the reads); the second reads mapped pages. Prints a table
// and writes bench/out/stage_read.json (run from the repository root).
// Usage: strata_bench_stage_read [file=a new 2 GiB file in /dev/shm, removed after] [expert MiB=6]
//        [max threads=16]
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "expert_cache/stage_copy.h"

namespace {

std::string make_file(size_t bytes) {
  const std::string path = "/dev/shm/strata-stage-read-" + std::to_string(getpid());
  std::ofstream f(path, std::ios::binary);
  std::vector<uint64_t> buf(size_t(1) << 17);
  std::mt19937_64 rng(1);
  for (size_t done = 0; done < bytes; done += buf.size() * 8) {
    for (auto& v : buf) v = rng();
    f.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size() * 8));
  }
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
  return path;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace strata;
  const bool own = argc < 2 || std::string(argv[1]).empty();
  const std::string path = own ? make_file(size_t(2) << 30) : argv[1];
  const size_t expert = static_cast<size_t>((argc > 2 ? std::atof(argv[2]) : 6.0) * (1 << 20));
  const int max_threads = argc > 3 ? std::atoi(argv[3]) : 16;
  const int fd = open(path.c_str(), O_RDONLY);
  struct stat st{};
  if (fd < 0 || fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < 2 * expert) {
    std::fprintf(stderr, "cannot read %s (or it is smaller than two experts)\n", path.c_str());
    return 1;
  }
  const size_t size = static_cast<size_t>(st.st_size);
  std::vector<uint8_t> stage(expert);
  // Each thread count reads its own ranges, so its first pass faults pages no earlier pass mapped.
  std::printf("file %s (%.2f GiB), experts of %.1f MiB as three segments, %d cores\n", path.c_str(),
              size / double(1 << 30), expert / double(1 << 20), ThreadPool::default_threads());
  std::printf("%8s %14s %14s\n", "threads", "first GB/s", "mapped GB/s");
  std::string json = "[";
  const int64_t n_experts = static_cast<int64_t>(size / expert);
  std::vector<int64_t> order(static_cast<size_t>(n_experts));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(2));
  size_t next = 0;
  for (int t = 1; t <= max_threads; t *= 2) {
    const size_t per =
        std::min<size_t>(order.size() / 6, 64);  // experts a pass (6 thread counts share the file)
    if (per == 0 || next + per > order.size()) break;
    void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
      std::fprintf(stderr, "mmap failed\n");
      return 1;
    }
    ThreadPool pool(t);
    double gbps[2];
    for (int pass = 0; pass < 2; ++pass) {
      const auto t0 = std::chrono::steady_clock::now();
      for (size_t i = 0; i < per; ++i) {
        const uint8_t* src = static_cast<const uint8_t*>(map) + static_cast<size_t>(order[next + i]) * expert;
        const size_t a = expert / 3, b = expert / 3;
        const ExpertCopy c[3] = {{0, src, a}, {a, src + a, b}, {a + b, src + a + b, expert - a - b}};
        stage_copy(pool, stage.data(), c, 3);
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      gbps[pass] = per * expert / s / 1e9;
    }
    next += per;
    munmap(map, size);
    std::printf("%8d %14.2f %14.2f\n", t, gbps[0], gbps[1]);
    json += std::string(json.size() > 1 ? "," : "") + "{\"threads\":" + std::to_string(t) +
            ",\"first_gbps\":" + std::to_string(gbps[0]) + ",\"mapped_gbps\":" + std::to_string(gbps[1]) +
            "}";
  }
  close(fd);
  if (own) std::filesystem::remove(path);
  std::filesystem::create_directories("bench/out");
  std::ofstream("bench/out/stage_read.json")
      << "{\"file\":\"" << path << "\",\"expert_bytes\":" << expert << ",\"rows\":" << json << "]}\n";
  std::printf("wrote bench/out/stage_read.json\n");
  return 0;
}
