// Host -> device link probe: the bandwidth of the machine's host link as strata uses it (pinned copies, one
// large and many expert-sized; pageable copies; a registered file mapping copied and read zero-copy), with
// the GPU's NUMA node and where the host pages live, so a benchmark's streaming numbers can be tied to the
// link and the placement they ran on. Prints a table; --json PATH writes the same as JSON.
//
// Each row: one untimed warm-up run, then --reps runs timed by CUDA events (each run waited for), the median
// and the best reported. GB/s is 1e9 bytes a second.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr const char* kName = "strata_bench_cuda_link";
constexpr size_t kPage = 4096, KiB = size_t{1} << 10, MiB = size_t{1} << 20, GiB = size_t{1} << 30;
constexpr int kThreads = 256, kInFlight = 8;  // the zero-copy read: as strata's expert fill kernel

const char* const kUsage =
    "usage: strata_bench_cuda_link [options]\n"
    "  --device N          the GPU (default 0)\n"
    "  --big MIB           the single large copies' size (default 1024)\n"
    "  --piece KIB         an expert-sized piece, a multiple of 4 (default 3072)\n"
    "  --experts N         pieces a layer (default 8)\n"
    "  --layers N          layers of pieces in the expert-copy row (default 48)\n"
    "  --reps N            timed runs a row, after one warm-up (default 5)\n"
    "  --zc-blocks N[,N]   blocks of the zero-copy read kernel, one row each (default 16, strata's fill)\n"
    "  --file PATH         also: mmap PATH read-only, register it (cudaHostRegisterReadOnly), copy "
    "--file-bytes\n"
    "                      of it to the device in pieces spread over the file, and read them zero-copy\n"
    "  --file-bytes SIZE   bytes of the file a run moves, e.g. 4GiB (default min(file size, 8 GiB), in "
    "pages)\n"
    "  --json PATH         also write the results as JSON\n"
    "  --help              this text\n";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "%s: %s (--help lists the options)\n", kName, msg.c_str());
  std::exit(2);
}

void check(cudaError_t e, const char* call, int line) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s failed: %s (%s, line %d)\n", kName, call, cudaGetErrorString(e), __FILE__,
               line);
  std::exit(1);
}
#define CHECK(call) check((call), #call, __LINE__)

// Arguments: a whole number in [lo, hi] for `flag`, or a size with an optional binary suffix (k, M, G,
// KiB...).
int64_t parse_int(const std::string& flag, const char* v, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v, &end, 10);
  if (errno || end == v || *end || n < lo || n > hi)
    usage_error(flag + " " + v + ": expected a whole number from " + std::to_string(lo) + " to " +
                std::to_string(hi));
  return n;
}

size_t parse_size(const std::string& flag, const char* v) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(v, &end, 10);
  std::string unit = end ? end : "";
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::map<std::string, size_t> units = {{"", 1},    {"b", 1},     {"k", KiB}, {"kib", KiB},
                                               {"m", MiB}, {"mib", MiB}, {"g", GiB}, {"gib", GiB}};
  const auto u = units.find(unit);
  if (errno || end == v || v[0] == '-' || u == units.end() || n == 0 || n > (~size_t{0}) / u->second)
    usage_error(flag + " " + v + ": expected a positive size, e.g. 8GiB, 512MiB or 1073741824");
  return n * u->second;
}

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += c;
    }
  }
  return o + "\"";
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

// The NUMA nodes of `samples` pages spread evenly over [p, p + bytes), counted per node (move_pages with no
// target nodes reports where each page is; a negative key is a page's error, e.g. -2: not present). Empty
// where the kernel reports nothing (no NUMA support).
std::map<int, int> page_nodes(const void* p, size_t bytes, int samples) {
  const size_t pages = std::max<size_t>(bytes / kPage, 1);
  const size_t n = std::min<size_t>(samples, pages);
  std::vector<void*> addr(n);
  std::vector<int> status(n, 0);
  for (size_t i = 0; i < n; ++i)
    addr[i] = const_cast<char*>(static_cast<const char*>(p)) + (i * pages / n) * kPage;
  std::map<int, int> count;
  if (syscall(SYS_move_pages, 0, n, addr.data(), nullptr, status.data(), 0) != 0) return count;
  for (const int s : status) ++count[s];
  return count;
}

std::string nodes_text(const std::map<int, int>& nodes) {
  if (nodes.empty()) return "unknown";
  std::string s;
  for (const auto& [node, n] : nodes)
    s += (s.empty() ? "" : ", ") +
         (node >= 0 ? "node " + std::to_string(node) : "error " + std::to_string(node)) + ": " +
         std::to_string(n);
  return s;
}

std::string nodes_json(const std::map<int, int>& nodes) {
  std::string s = "{";
  for (const auto& [node, n] : nodes)
    s += (s.size() > 1 ? ", " : "") + json_str(std::to_string(node)) + ": " + std::to_string(n);
  return s + "}";
}

// n pieces of `piece` bytes, piece i at (i % wrap) * stride from the region's start.
struct Pieces {
  size_t n, piece, stride, wrap;
  size_t offset(size_t i) const { return (i % wrap) * stride; }
  size_t bytes() const { return n * piece; }
};

// `bytes` (whole pages, at least one) of a region in pieces spread evenly over it, the last ending inside it.
Pieces spread(size_t region, size_t bytes, size_t piece) {
  piece = std::min(piece, bytes);
  const size_t n = bytes / piece;
  const size_t stride = n > 1 ? (region - piece) / (n - 1) / kPage * kPage : 0;
  return {n, piece, stride, n};
}

struct Timing {
  double med_s = 0, best_s = 0;
};

// One warm-up run of `run` (queued on s), then `reps` runs each timed by events on s and waited for.
Timing time_runs(cudaStream_t s, int reps, const std::function<void()>& run) {
  run();
  CHECK(cudaStreamSynchronize(s));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    CHECK(cudaEventRecord(a, s));
    run();
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e-3);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front()};
}

// Copies every piece of `src` to the device ring `dst` (wrapping after dst_bytes), in order on s.
void copy_pieces(uint8_t* dst, size_t dst_bytes, const uint8_t* src, const Pieces& p, cudaStream_t s) {
  const size_t dst_wrap = std::max<size_t>(dst_bytes / p.piece, 1);
  for (size_t i = 0; i < p.n; ++i)
    CHECK(cudaMemcpyAsync(dst + (i % dst_wrap) * p.piece, src + p.offset(i), p.piece, cudaMemcpyHostToDevice,
                          s));
}

// The zero-copy read: every block's threads stride over one piece at a time, as strata's fill kernel does,
// each thread keeping kInFlight 16-byte loads in flight; the xor of what it read goes to out so nothing is
// elided.
__global__ void __launch_bounds__(kThreads) read_kernel(const uint4* base, int64_t n, int64_t piece16,
                                                        int64_t stride16, int64_t wrap, uint32_t* out) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  uint32_t acc = 0;
  for (int64_t p = 0; p < n; ++p) {
    const uint4* src = base + (p % wrap) * stride16;
    for (int64_t i0 = first; i0 < piece16; i0 += step * kInFlight) {
      uint4 v[kInFlight];
#pragma unroll
      for (int k = 0; k < kInFlight; ++k)
        if (i0 + k * step < piece16) v[k] = src[i0 + k * step];
#pragma unroll
      for (int k = 0; k < kInFlight; ++k)
        if (i0 + k * step < piece16) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
  }
  out[first] = acc;
}

struct Row {
  Row(std::string name_, std::string label_, size_t bytes_ = 0)
      : name(std::move(name_)), label(std::move(label_)), bytes(bytes_) {}
  std::string name, label;
  size_t bytes;  // a run's
  Timing t;
  int blocks = 0;     // the zero-copy rows'
  std::string error;  // set: the row could not run
};

struct Probe {
  int reps;
  cudaStream_t s;
  std::vector<Row> rows;

  void print(const Row& r) const {
    if (!r.error.empty()) {
      std::printf("%-46s error: %s\n", r.label.c_str(), r.error.c_str());
    } else {
      const double b = static_cast<double>(r.bytes);
      std::printf("%-46s %9.3f %9.1f %9.1f %9.2f\n", r.label.c_str(), b / GiB, b / r.t.med_s * 1e-9,
                  b / r.t.best_s * 1e-9, r.t.med_s * 1e3);
    }
    std::fflush(stdout);
  }
  void copy_row(const std::string& name, const std::string& label, uint8_t* dst, size_t dst_bytes,
                const uint8_t* src, const Pieces& p) {
    Row r{name, label, p.bytes()};
    r.t = time_runs(s, reps, [&] { copy_pieces(dst, dst_bytes, src, p, s); });
    rows.push_back(r);
    print(r);
  }
  void zero_copy_rows(const std::string& name, const std::string& what, const void* dev_view, const Pieces& p,
                      const std::vector<int>& blocks, uint32_t* out) {
    for (const int b : blocks) {
      Row r{name, what + ", zero-copy read, " + std::to_string(b) + " x " + std::to_string(kThreads),
            p.bytes()};
      r.blocks = b;
      r.t = time_runs(s, reps, [&] {
        read_kernel<<<b, kThreads, 0, s>>>(static_cast<const uint4*>(dev_view), static_cast<int64_t>(p.n),
                                           static_cast<int64_t>(p.piece / 16),
                                           static_cast<int64_t>(p.stride / 16), static_cast<int64_t>(p.wrap),
                                           out);
        CHECK(cudaGetLastError());
      });
      rows.push_back(r);
      print(r);
    }
  }
  void error_row(const std::string& name, const std::string& label, const std::string& error) {
    Row r{name, label};
    r.error = error;
    rows.push_back(r);
    print(r);
  }
};

// A size for labels: whole GiB, MiB or KiB where it is one, else GiB or MiB with two decimals.
std::string size_text(size_t bytes) {
  char b[32];
  if (bytes % GiB == 0)
    std::snprintf(b, sizeof b, "%zu GiB", bytes / GiB);
  else if (bytes >= GiB)
    std::snprintf(b, sizeof b, "%.2f GiB", static_cast<double>(bytes) / GiB);
  else if (bytes % MiB == 0)
    std::snprintf(b, sizeof b, "%zu MiB", bytes / MiB);
  else if (bytes >= MiB)
    std::snprintf(b, sizeof b, "%.2f MiB", static_cast<double>(bytes) / MiB);
  else if (bytes % KiB == 0)
    std::snprintf(b, sizeof b, "%zu KiB", bytes / KiB);
  else
    std::snprintf(b, sizeof b, "%zu bytes", bytes);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  int device = 0, reps = 5;
  size_t big = GiB, piece = 3 * MiB, file_bytes = 0;
  int64_t experts = 8, layers = 48;
  std::vector<int> zc_blocks = {16};
  std::string file, json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    if (a.rfind("--", 0) != 0) usage_error("unexpected argument " + a);
    if (i + 1 >= argc) usage_error(a + " needs a value");
    const char* v = argv[++i];
    if (a == "--device") {
      device = static_cast<int>(parse_int(a, v, 0, 1023));
    } else if (a == "--big") {
      big = static_cast<size_t>(parse_int(a, v, 1, 1 << 20)) * MiB;
    } else if (a == "--piece") {
      const int64_t k = parse_int(a, v, 4, 1 << 20);
      if (k % 4) usage_error(a + " " + v + ": a piece is whole 4 KiB pages (a multiple of 4)");
      piece = static_cast<size_t>(k) * KiB;
    } else if (a == "--experts") {
      experts = parse_int(a, v, 1, 1 << 16);
    } else if (a == "--layers") {
      layers = parse_int(a, v, 1, 1 << 16);
    } else if (a == "--reps") {
      reps = static_cast<int>(parse_int(a, v, 1, 100000));
    } else if (a == "--zc-blocks") {
      zc_blocks.clear();
      std::string list = v;
      for (size_t p = 0; p <= list.size();) {
        const size_t e = std::min(list.find(',', p), list.size());
        zc_blocks.push_back(static_cast<int>(parse_int(a, list.substr(p, e - p).c_str(), 1, 65535)));
        p = e + 1;
      }
    } else if (a == "--file") {
      file = v;
    } else if (a == "--file-bytes") {
      file_bytes = parse_size(a, v);
    } else if (a == "--json") {
      json = v;
    } else {
      usage_error("unknown option " + a);
    }
  }
  if (piece > big) usage_error("--piece is larger than --big: the expert copies come from the --big buffer");
  if (file_bytes && file.empty()) usage_error("--file-bytes without --file");
  int fd = -1;
  struct stat st{};
  if (!file.empty()) {  // a bad path fails here, before any measurement
    fd = open(file.c_str(), O_RDONLY);
    if (fd < 0) usage_error("--file " + file + ": cannot open: " + std::strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) usage_error("--file " + file + ": not a regular file");
  }

  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  if (device >= count)
    usage_error("--device " + std::to_string(device) + ": this machine has " + std::to_string(count) +
                " CUDA device(s)");
  CHECK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, device));

  // Placement: the GPU's NUMA node and PCIe link as sysfs reports them, and the node this thread runs on.
  char bus[64] = {};
  CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, device));
  std::string bus_id = bus;
  for (auto& c : bus_id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (const size_t colon = bus_id.find(':'); colon != std::string::npos) {  // sysfs's 4-digit domain
    char b[80];
    std::snprintf(b, sizeof b, "%04lx%s", std::strtoul(bus_id.substr(0, colon).c_str(), nullptr, 16),
                  bus_id.substr(colon).c_str());
    bus_id = b;
  }
  const std::string pci = "/sys/bus/pci/devices/" + bus_id + "/";
  const std::string numa_text = read_line(pci + "numa_node");
  const int gpu_node = numa_text.empty() ? -1 : std::atoi(numa_text.c_str());
  int numa_nodes = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/sys/devices/system/node", ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() > 4 && n.rfind("node", 0) == 0 &&
        std::all_of(n.begin() + 4, n.end(), [](char c) { return c >= '0' && c <= '9'; }))
      ++numa_nodes;
  }
  const std::string link_speed = read_line(pci + "current_link_speed"),
                    link_width = read_line(pci + "current_link_width"),
                    max_speed = read_line(pci + "max_link_speed"),
                    max_width = read_line(pci + "max_link_width");
  unsigned cpu = 0, cpu_node = 0;
  const bool have_cpu = syscall(SYS_getcpu, &cpu, &cpu_node, nullptr) == 0;

  std::printf("%s: %s, PCI %s, NUMA node %s of %s; PCIe link %s x%s (max %s x%s)\n", kName, prop.name,
              bus_id.c_str(), gpu_node >= 0 ? std::to_string(gpu_node).c_str() : "? (none reported)",
              numa_nodes ? std::to_string(numa_nodes).c_str() : "?",
              link_speed.empty() ? "?" : link_speed.c_str(), link_width.empty() ? "?" : link_width.c_str(),
              max_speed.empty() ? "?" : max_speed.c_str(), max_width.empty() ? "?" : max_width.c_str());

  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  uint8_t *pinned = nullptr, *dst = nullptr;
  uint32_t* out = nullptr;
  CHECK(cudaHostAlloc(reinterpret_cast<void**>(&pinned), big, cudaHostAllocPortable | cudaHostAllocMapped));
  std::memset(pinned, 1, big);
  CHECK(cudaMalloc(&dst, big));
  int max_blocks = 0;
  for (const int b : zc_blocks) max_blocks = std::max(max_blocks, b);
  CHECK(cudaMalloc(&out, static_cast<size_t>(max_blocks) * kThreads * sizeof(uint32_t)));
  const std::map<int, int> pinned_nodes = page_nodes(pinned, big, 64);
  std::printf("host thread on CPU %s (node %s); pinned buffer's pages: %s; %d timed runs a row\n",
              have_cpu ? std::to_string(cpu).c_str() : "?", have_cpu ? std::to_string(cpu_node).c_str() : "?",
              nodes_text(pinned_nodes).c_str(), reps);
  std::printf("%-46s %9s %9s %9s %9s\n", "test", "GiB/run", "GB/s med", "GB/s best", "ms med");

  Probe probe{reps, s, {}};
  const std::string big_text = size_text(big);
  probe.copy_row("pinned", "pinned -> device, one " + big_text + " copy", dst, big, pinned, {1, big, 0, 1});
  const Pieces expert{static_cast<size_t>(experts * layers), piece, piece, big / piece};
  probe.copy_row("pinned_experts",
                 "pinned -> device, " + std::to_string(layers) + " x " + std::to_string(experts) + " x " +
                     size_text(piece),
                 dst, big, pinned, expert);
  {
    std::vector<uint8_t> pageable(big, 1);  // touched: every page resident before the first copy
    probe.copy_row("pageable", "pageable -> device, one " + big_text + " copy", dst, big, pageable.data(),
                   {1, big, 0, 1});
  }
  void* pinned_view = nullptr;
  CHECK(cudaHostGetDevicePointer(&pinned_view, pinned, 0));
  probe.zero_copy_rows("pinned_zero_copy", "pinned", pinned_view, spread(big, big, piece), zc_blocks, out);

  // The file: mapped and registered as strata's registered source does it (read-only, mapped for kernels).
  std::string file_error;
  double register_s = 0;
  std::map<int, int> file_nodes;
  Pieces fp{0, 0, 0, 1};
  if (fd >= 0) {
    const size_t size = static_cast<size_t>(st.st_size), whole = size / kPage * kPage;
    const size_t map_len = (size + kPage - 1) / kPage * kPage;
    size_t want = file_bytes ? file_bytes : std::min<size_t>(size, 8 * GiB);
    want = std::min(want / kPage * kPage, whole);
    void* map = MAP_FAILED;
    if (whole == 0) {
      file_error = "the file is smaller than a page (" + std::to_string(size) + " bytes)";
    } else {
      map = mmap(nullptr, map_len, PROT_READ, MAP_SHARED, fd, 0);
      if (map == MAP_FAILED) file_error = std::string("mmap failed: ") + std::strerror(errno);
    }
    if (file_error.empty() && want == 0) file_error = "--file-bytes is less than a page";
    fp = spread(whole, std::max(want, kPage), piece);
    const std::string copy_label =
        "file -> device, " + std::to_string(fp.n) + " x " + size_text(fp.piece) + " spread";
    bool registered = false;
    if (file_error.empty()) {
      const auto t0 = std::chrono::steady_clock::now();
      const cudaError_t e = cudaHostRegister(
          map, map_len, cudaHostRegisterPortable | cudaHostRegisterMapped | cudaHostRegisterReadOnly);
      register_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (e != cudaSuccess) {
        cudaGetLastError();  // not sticky: clear it, the other rows stand
        file_error = std::string("cudaHostRegister(ReadOnly | Mapped) of ") + size_text(map_len) +
                     " failed: " + cudaGetErrorString(e);
      } else {
        registered = true;
      }
    }
    std::printf("file %s: %s", file.c_str(), size_text(size).c_str());
    if (registered) {
      file_nodes = page_nodes(map, whole, 256);
      std::printf(", registered in %.2f s; pages sampled: %s", register_s, nodes_text(file_nodes).c_str());
    }
    std::printf("\n");
    if (!registered) {
      probe.error_row("file_copy", copy_label, file_error);
      probe.error_row("file_zero_copy", "file, zero-copy read", file_error);
    } else {
      probe.copy_row("file_copy", copy_label, dst, big, static_cast<const uint8_t*>(map), fp);
      void* view = nullptr;
      const cudaError_t e = cudaHostGetDevicePointer(&view, map, 0);
      if (e != cudaSuccess) {
        cudaGetLastError();
        probe.error_row("file_zero_copy", "file, zero-copy read",
                        std::string("cudaHostGetDevicePointer failed: ") + cudaGetErrorString(e));
      } else {
        probe.zero_copy_rows("file_zero_copy", "file", view, fp, zc_blocks, out);
      }
      CHECK(cudaHostUnregister(map));
    }
    if (map != MAP_FAILED && munmap(map, map_len) != 0)
      std::fprintf(stderr, "%s: munmap of %s failed: %s\n", kName, file.c_str(), std::strerror(errno));
    close(fd);
  }

  CHECK(cudaFree(out));
  CHECK(cudaFree(dst));
  CHECK(cudaFreeHost(pinned));
  CHECK(cudaStreamDestroy(s));

  if (!json.empty()) {
    std::string j =
        "{\"device\": " + json_str(prop.name) + ", \"pci_bus_id\": " + json_str(bus_id) +
        ", \"gpu_numa_node\": " + std::to_string(gpu_node) +
        ", \"numa_nodes\": " + std::to_string(numa_nodes) +
        ",\n \"pcie\": {\"speed\": " + json_str(link_speed) + ", \"width\": " + json_str(link_width) +
        ", \"max_speed\": " + json_str(max_speed) + ", \"max_width\": " + json_str(max_width) +
        "},\n \"cpu\": " + (have_cpu ? std::to_string(cpu) : "null") +
        ", \"cpu_numa_node\": " + (have_cpu ? std::to_string(cpu_node) : "null") +
        ", \"pinned_page_nodes\": " + nodes_json(pinned_nodes) + ", \"reps\": " + std::to_string(reps) +
        ", \"piece_bytes\": " + std::to_string(piece) + ",\n \"file\": ";
    if (fd >= 0) {
      j += "{\"path\": " + json_str(file) + ", \"size\": " + std::to_string(st.st_size) +
           ", \"bytes_per_run\": " + std::to_string(fp.bytes()) + ", \"register_s\": " + num(register_s) +
           ", \"page_nodes\": " + nodes_json(file_nodes) +
           ", \"error\": " + (file_error.empty() ? "null" : json_str(file_error)) + "}";
    } else {
      j += "null";
    }
    j += ",\n \"tests\": [";
    for (size_t i = 0; i < probe.rows.size(); ++i) {
      const Row& r = probe.rows[i];
      j += std::string(i ? "," : "") + "\n  {\"name\": " + json_str(r.name) +
           ", \"label\": " + json_str(r.label);
      if (r.blocks) j += ", \"blocks\": " + std::to_string(r.blocks);
      if (!r.error.empty()) {
        j += ", \"error\": " + json_str(r.error) + "}";
        continue;
      }
      j += ", \"bytes\": " + std::to_string(r.bytes) +
           ", \"gbps\": " + num(static_cast<double>(r.bytes) / r.t.med_s * 1e-9) +
           ", \"gbps_best\": " + num(static_cast<double>(r.bytes) / r.t.best_s * 1e-9) +
           ", \"ms\": " + num(r.t.med_s * 1e3) + "}";
    }
    j += "\n]}\n";
    std::ofstream f(json);
    f << j;
    if (!f.flush()) {
      std::fprintf(stderr, "%s: cannot write --json %s\n", kName, json.c_str());
      return 1;
    }
    std::printf("wrote %s\n", json.c_str());
  }
  return 0;
}
