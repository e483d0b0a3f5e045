#include "tokenizer/jinja.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "kvslim/error.h"

extern char** environ;

namespace kvslim {

namespace {

// The child: reads {"template":..., "context":{...}} on stdin, writes the text on stdout. Exit 3:
// jinja2 missing; 2: the template failed (message on stderr).
const char* kRenderer = R"PY(
import sys, json, datetime
try:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    sys.stderr.write("python3 has no jinja2 module")
    sys.exit(3)
def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
def strftime_now(f):
    return datetime.datetime.now().strftime(f)
req = json.load(sys.stdin)
try:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    out = env.from_string(req["template"]).render(**req["context"])
except Exception as e:
    sys.stderr.write(type(e).__name__ + ": " + str(e))
    sys.exit(2)
sys.stdout.write(out)
)PY";

// Closes the file descriptors it holds on every path.
struct Fd {
  int fd = -1;
  ~Fd() { close_now(); }
  void close_now() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

}  // namespace

std::string render_jinja(const std::string& source, const nlohmann::json& context, const std::string& where,
                         double timeout_s) {
  // Debian's python3-jinja2 belongs to /usr/bin/python3, which a python3 earlier on PATH (a
  // virtual environment, pyenv) may not see.
  const char* env_python = std::getenv("KVSLIM_PYTHON");
  const std::string python = env_python && *env_python                 ? env_python
                             : access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3"
                                                                      : "python3";
  int in[2], out[2], err[2];
  if (pipe2(in, O_CLOEXEC) != 0) throw Error(fmt::format("{}: cannot create a pipe to Jinja", where));
  Fd in_r{in[0]}, in_w{in[1]};
  if (pipe2(out, O_CLOEXEC) != 0) throw Error(fmt::format("{}: cannot create a pipe to Jinja", where));
  Fd out_r{out[0]}, out_w{out[1]};
  if (pipe2(err, O_CLOEXEC) != 0) throw Error(fmt::format("{}: cannot create a pipe to Jinja", where));
  Fd err_r{err[0]}, err_w{err[1]};

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in_r.fd, 0);
  posix_spawn_file_actions_adddup2(&fa, out_w.fd, 1);
  posix_spawn_file_actions_adddup2(&fa, err_w.fd, 2);
  std::string arg0 = python, arg1 = "-c", arg2 = kRenderer;
  char* argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, python.c_str(), &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0)
    throw Error(fmt::format("{}: the template is not one kvslim renders itself and '{}' (the Jinja engine, "
                            "python3-jinja2; set KVSLIM_PYTHON to choose another) cannot start: {}",
                            where, python, std::strerror(rc)));
  in_r.close_now();
  out_w.close_now();
  err_w.close_now();

  // The child reads all of stdin before writing, but write, read stdout and read stderr together
  // anyway, so that no pipe can fill and stall either side.
  const std::string request = nlohmann::json{{"template", source}, {"context", context}}.dump();
  size_t written = 0;
  std::string text, message;
  fcntl(in_w.fd, F_SETFL, O_NONBLOCK);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  bool timed_out = false;
  while (out_r.fd >= 0 || err_r.fd >= 0) {
    pollfd p[3];
    int n = 0;
    if (in_w.fd >= 0) p[n++] = {in_w.fd, POLLOUT, 0};
    if (out_r.fd >= 0) p[n++] = {out_r.fd, POLLIN, 0};
    if (err_r.fd >= 0) p[n++] = {err_r.fd, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    if (poll(p, n, static_cast<int>(left.count())) < 0 && errno != EINTR) break;
    for (int i = 0; i < n; ++i) {
      if (!p[i].revents) continue;
      if (p[i].fd == in_w.fd) {
        const ssize_t w = ::write(in_w.fd, request.data() + written, request.size() - written);
        if (w > 0) written += static_cast<size_t>(w);
        if (w < 0 && errno != EAGAIN && errno != EINTR) written = request.size();  // child gone; its exit says why
        if (written == request.size()) in_w.close_now();
      } else {
        char buf[65536];
        const ssize_t r = ::read(p[i].fd, buf, sizeof buf);
        if (r > 0) {
          (p[i].fd == out_r.fd ? text : message).append(buf, static_cast<size_t>(r));
        } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
          (p[i].fd == out_r.fd ? out_r : err_r).close_now();
        }
      }
    }
  }
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) throw Error(fmt::format("{}: Jinja rendering took longer than {} s", where, timeout_s));
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 0) return text;
  if (message.size() > 300) message = message.substr(0, 300) + "...";
  if (code == 3 || code == 127 || (code == 1 && message.find("No module named") != std::string::npos))
    throw Error(fmt::format("{}: the template is not one kvslim renders itself and '{}' has no Jinja engine "
                            "(install Debian's python3-jinja2, or set KVSLIM_PYTHON to a python3 that has jinja2)",
                            where, python));
  if (code == 2) throw Error(fmt::format("{}: the template cannot be rendered: {}", where, message));
  throw Error(fmt::format("{}: Jinja rendering with '{}' failed (exit {}): {}", where, python, code, message));
}

}  // namespace kvslim
