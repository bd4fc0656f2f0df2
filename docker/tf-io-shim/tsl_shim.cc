// libsm_tsl_shim.so: the 18 TensorFlow-internal symbols that tensorflow-io 0.37.1's
// file system plugins (libtensorflow_io_plugins.so: s3://, az://, hdfs://, http://) need and
// TensorFlow 2.21 no longer exports, so that s3:// works on the 2.21 line.
//
// Why: tensorflow-io's last release was built against TensorFlow 2.16, whose
// libtensorflow_framework.so.2 exported these tsl:: functions and the C API's TF_Log. 2.21
// keeps them internal, so tf.experimental.register_filesystem_plugin fails with
// `undefined symbol: _ZN3tsl5mutex6unlockEv`. Listed with `nm -D --undefined-only` of the
// plugin library against `nm -D --defined-only` of TF 2.21's libraries and the system's:
// these 18 are all that is missing (the rest are weak: _ITM_*, __gmon_start__, one abseil TLS
// init function of the plugin's own abseil copy).
//
// How: tf_s3 dlopens this library RTLD_GLOBAL before it registers the plugin, whose undefined
// symbols then bind here. Nothing of TensorFlow 2.21 binds here: it neither exports nor
// imports these names. Every object these functions touch is the plugin's own (its
// mutexes, its log lines), never shared with TensorFlow, so each needs only to match the
// layout the plugin was compiled with, taken from TensorFlow 2.16.2's headers (the wheel's
// tensorflow/include):
//   tsl/platform/mutex.h, default/mutex_data.h: mutex holds `internal::MuData mu_`
//     (`void* space[2]`), zero-initialized means unlocked ("safe to use after the linker
//     initialization to zero"), no destructor. Here: a futex lock in its first 4 bytes.
//   tsl/platform/strcat.h: AlphaNum starts with `StringPiece piece_` (absl::string_view,
//     which is std::string_view in that build: the mangled names say so).
//   tsl/platform/default/logging.h: LogMessage is a std::ostringstream followed by
//     `const char* fname_; int line_; int severity_;`; LogMessageFatal adds nothing.
//   tensorflow/c/logging.h: TF_Log(TF_LogLevel, fmt, ...), TF_VLog(int, fmt, ...).
// Log lines go to stderr in TensorFlow's format and obey TF_CPP_MIN_LOG_LEVEL and
// TF_CPP_MAX_VLOG_LEVEL (not TF_CPP_VMODULE).

#include <linux/futex.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <initializer_list>
#include <sstream>
#include <string>
#include <string_view>

#define SHIM_EXPORT __attribute__((visibility("default")))

namespace tsl {

namespace internal {
struct MuData {
  void* space[2];
};
}  // namespace internal

class SHIM_EXPORT mutex {
 public:
  mutex();
  void lock();
  void unlock();

 private:
  internal::MuData mu_;
};

namespace strings {
class AlphaNum {
 public:
  std::string_view Piece() const { return piece_; }

 private:
  std::string_view piece_;
  char digits_[32];  // kFastToBufferSize
};

namespace internal {
SHIM_EXPORT std::string CatPieces(std::initializer_list<std::string_view> pieces);
}  // namespace internal

SHIM_EXPORT std::string StrCat(const AlphaNum& a);
SHIM_EXPORT std::string StrCat(const AlphaNum& a, const AlphaNum& b);
SHIM_EXPORT std::string StrCat(const AlphaNum& a, const AlphaNum& b, const AlphaNum& c);
SHIM_EXPORT std::string StrCat(const AlphaNum& a, const AlphaNum& b, const AlphaNum& c,
                               const AlphaNum& d);
}  // namespace strings

namespace str_util {
SHIM_EXPORT bool StartsWith(std::string_view text, std::string_view prefix);
SHIM_EXPORT bool EndsWith(std::string_view text, std::string_view suffix);
SHIM_EXPORT bool ConsumePrefix(std::string_view* s, std::string_view expected);
}  // namespace str_util

namespace internal {
class SHIM_EXPORT LogMessage : public std::basic_ostringstream<char> {
 public:
  LogMessage(const char* fname, int line, int severity);
  ~LogMessage() override;
  static bool VmoduleActivated(const char* fname, int level);

 protected:
  void GenerateLogMessage();

 private:
  const char* fname_;
  int line_;
  int severity_;
};

class SHIM_EXPORT LogMessageFatal : public LogMessage {
 public:
  LogMessageFatal(const char* file, int line);
  [[noreturn]] ~LogMessageFatal() override;
};
}  // namespace internal

// ------------------------------------------------------------------------------------------
// mutex: 0 unlocked, 1 locked, 2 locked with waiters (Drepper, "Futexes Are Tricky", mutex2).

static_assert(sizeof(internal::MuData) >= sizeof(std::atomic<uint32_t>));

namespace {
std::atomic<uint32_t>* StateOf(internal::MuData* data) {
  return reinterpret_cast<std::atomic<uint32_t>*>(data);
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr,
          nullptr, 0);
}

void FutexWakeOne(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr,
          0);
}
}  // namespace

mutex::mutex() { new (StateOf(&mu_)) std::atomic<uint32_t>(0); }

void mutex::lock() {
  std::atomic<uint32_t>* state = StateOf(&mu_);
  uint32_t seen = 0;
  if (state->compare_exchange_strong(seen, 1, std::memory_order_acquire)) return;
  if (seen != 2) seen = state->exchange(2, std::memory_order_acquire);
  while (seen != 0) {
    FutexWait(state, 2);
    seen = state->exchange(2, std::memory_order_acquire);
  }
}

void mutex::unlock() {
  std::atomic<uint32_t>* state = StateOf(&mu_);
  if (state->fetch_sub(1, std::memory_order_release) != 1) {
    state->store(0, std::memory_order_release);
    FutexWakeOne(state);
  }
}

// ------------------------------------------------------------------------------------------
// strings

std::string strings::internal::CatPieces(std::initializer_list<std::string_view> pieces) {
  size_t size = 0;
  for (std::string_view piece : pieces) size += piece.size();
  std::string result;
  result.reserve(size);
  for (std::string_view piece : pieces) result.append(piece);
  return result;
}

std::string strings::StrCat(const AlphaNum& a) { return std::string(a.Piece()); }

std::string strings::StrCat(const AlphaNum& a, const AlphaNum& b) {
  return internal::CatPieces({a.Piece(), b.Piece()});
}

std::string strings::StrCat(const AlphaNum& a, const AlphaNum& b, const AlphaNum& c) {
  return internal::CatPieces({a.Piece(), b.Piece(), c.Piece()});
}

std::string strings::StrCat(const AlphaNum& a, const AlphaNum& b, const AlphaNum& c,
                            const AlphaNum& d) {
  return internal::CatPieces({a.Piece(), b.Piece(), c.Piece(), d.Piece()});
}

bool str_util::StartsWith(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

bool str_util::EndsWith(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

bool str_util::ConsumePrefix(std::string_view* s, std::string_view expected) {
  if (!StartsWith(*s, expected)) return false;
  s->remove_prefix(expected.size());
  return true;
}

// ------------------------------------------------------------------------------------------
// logging

namespace {
constexpr int kFatal = 3;

int64_t EnvLevel(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? 0 : std::strtoll(value, nullptr, 10);
}

// One line to stderr, as TensorFlow writes it: "2026-11-28 04:10:00.123456: W file:12] text".
void WriteLine(int severity, const char* fname, int line, std::string_view text) {
  if (severity < kFatal && severity < EnvLevel("TF_CPP_MIN_LOG_LEVEL")) return;
  timeval now{};
  gettimeofday(&now, nullptr);
  tm utc{};
  gmtime_r(&now.tv_sec, &utc);
  char when[32];
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &utc);
  const char level = "IWEF"[severity < 0 ? 0 : (severity > kFatal ? kFatal : severity)];
  std::fprintf(stderr, "%s.%06ld: %c %s:%d] %.*s\n", when, static_cast<long>(now.tv_usec),
               level, fname, line, static_cast<int>(text.size()), text.data());
}

void WriteFormatted(int severity, const char* fmt, va_list args) {
  char buffer[1024];
  std::vsnprintf(buffer, sizeof(buffer), fmt, args);
  WriteLine(severity, "tensorflow/c/logging.cc", 0, buffer);
}
}  // namespace

internal::LogMessage::LogMessage(const char* fname, int line, int severity)
    : fname_(fname), line_(line), severity_(severity) {}

internal::LogMessage::~LogMessage() { GenerateLogMessage(); }

void internal::LogMessage::GenerateLogMessage() {
  WriteLine(severity_, fname_, line_, str());
}

bool internal::LogMessage::VmoduleActivated(const char* /*fname*/, int level) {
  return level <= EnvLevel("TF_CPP_MAX_VLOG_LEVEL");
}

internal::LogMessageFatal::LogMessageFatal(const char* file, int line)
    : LogMessage(file, line, kFatal) {}

internal::LogMessageFatal::~LogMessageFatal() {
  GenerateLogMessage();
  std::abort();
}

}  // namespace tsl

extern "C" {
typedef enum TF_LogLevel { TF_INFO = 0, TF_WARNING = 1, TF_ERROR = 2, TF_FATAL = 3 } TF_LogLevel;

SHIM_EXPORT void TF_Log(TF_LogLevel level, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  tsl::WriteFormatted(level, fmt, args);
  va_end(args);
  if (level == TF_FATAL) std::abort();
}

SHIM_EXPORT void TF_VLog(int level, const char* fmt, ...) {
  if (!tsl::internal::LogMessage::VmoduleActivated("", level)) return;
  va_list args;
  va_start(args, fmt);
  tsl::WriteFormatted(TF_INFO, fmt, args);
  va_end(args);
}
}
