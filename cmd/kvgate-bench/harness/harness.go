// Package harness runs kvgate's real processes for end-to-end tests and the benchmark: it builds the
// `kvgate` and `enginesim` binaries, starts enginesim processes on free loopback ports with KV events (ZMQ
// PUB) and replay (ZMQ ROUTER) sockets, writes gateway YAML configs from gateway/config's own types, starts
// `kvgate serve --config FILE` processes and waits for /readyz, and reads the processes' Prometheus pages.
//
// Every process runs in its own process group (and receives SIGKILL if the process that started it dies),
// so Stop/Kill reach any children too and nothing outlives a test run. Each process writes stdout and
// stderr to a log file; Tail returns its last lines for failure reports.
//
// The core API returns errors and takes no testing.TB, so cmd/kvgate-bench uses it too; testing.go adds
// helpers that fail a test and clean up with t.Cleanup.
package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Binaries are the paths of the built executables.
type Binaries struct {
	// KVGate is the gateway binary (cmd/kvgate).
	KVGate string
	// EngineSim is the engine simulator binary (cmd/enginesim).
	EngineSim string
}

// EnvBinDir names an environment variable that, when set, points at a directory already holding `kvgate`
// and `enginesim` executables; Build then uses them instead of compiling (CI that built them once, or a
// developer testing a binary built with extra tags).
const EnvBinDir = "KVGATE_E2E_BIN_DIR"

// RepoRoot returns the directory of the kvgate module (the nearest parent of the working directory holding
// go.mod with module github.com/kvgate/kvgate).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(b, []byte("module github.com/kvgate/kvgate\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("harness: no kvgate go.mod above the working directory")
		}
		dir = parent
	}
}

// Build compiles cmd/kvgate and cmd/enginesim of the module at root into outDir with one `go build`
// invocation (the go command from PATH, with the caller's environment: GOTOOLCHAIN, GOFLAGS). When the
// environment variable EnvBinDir is set, the binaries found there are returned instead.
func Build(ctx context.Context, root, outDir string) (Binaries, error) {
	if dir := os.Getenv(EnvBinDir); dir != "" {
		b := Binaries{KVGate: filepath.Join(dir, "kvgate"), EngineSim: filepath.Join(dir, "enginesim")}
		for _, p := range []string{b.KVGate, b.EngineSim} {
			if _, err := os.Stat(p); err != nil {
				return Binaries{}, fmt.Errorf("harness: %s=%s: %w", EnvBinDir, dir, err)
			}
		}
		return b, nil
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return Binaries{}, err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", outDir+string(filepath.Separator), "./cmd/kvgate", "./cmd/enginesim")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return Binaries{}, fmt.Errorf("harness: go build: %w\n%s", err, out)
	}
	return Binaries{KVGate: filepath.Join(outDir, "kvgate"), EngineSim: filepath.Join(outDir, "enginesim")}, nil
}

// BuildWasm compiles the Go policy package pkgDir (a directory relative to root, e.g.
// "examples/policies/round-robin") for wasip1 as a c-shared module written to out.
func BuildWasm(ctx context.Context, root, pkgDir, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildmode=c-shared", "-o", out, "./"+filepath.ToSlash(pkgDir))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("harness: build %s for wasip1: %w\n%s", pkgDir, err, b)
	}
	return nil
}

// FreePort returns a TCP port that was free on 127.0.0.1 a moment ago (another process may take it before
// the caller binds it; callers retry on a bind error).
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("harness: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Proc is one started process with its log file.
type Proc struct {
	// Name labels the process in errors and failure reports ("engine e1", "gateway g0").
	Name string
	// LogPath is the file receiving the process's stdout and stderr.
	LogPath string

	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	err  error // Wait's result once done is closed
}

// StartProc starts bin with args in its own process group, stdout and stderr appended to logPath, with env
// added to the current environment.
func StartProc(name, logPath, bin string, args []string, env []string) (*Proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("harness: %s: log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	// Own process group: signals reach the whole group. Pdeathsig: the kernel kills the process when the
	// thread that started it dies (go test killed by its timeout), so no process leaks.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("harness: %s: start: %w", name, err)
	}
	p := &Proc{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		logf.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// PID is the process ID (also its process-group ID).
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended, and how.
func (p *Proc) Exited() (bool, error) {
	select {
	case <-p.done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return true, p.err
	default:
		return false, nil
	}
}

// Done is closed when the process has ended.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Kill sends SIGKILL to the process group and waits for the process to end (at most 10 s).
func (p *Proc) Kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
}

// Stop sends SIGTERM to the process group, waits up to grace for the process to end, then kills it.
func (p *Proc) Stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
		// Children of the process, if any, share its group.
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	case <-time.After(grace):
		p.Kill()
	}
}

// Log returns the whole log file.
func (p *Proc) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// Tail returns the last n lines of the log.
func (p *Proc) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.Log(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// CPUTime returns the user+system CPU time the process has used so far, from /proc/<pid>/stat (utime and
// stime, in clock ticks of 1/100 s on Linux; resolution 10 ms, so measure over many requests).
func (p *Proc) CPUTime() (time.Duration, error) {
	return procCPUTime(p.PID())
}

// clockTicks is sysconf(_SC_CLK_TCK), 100 on every Linux this runs on (the kernel's USER_HZ).
const clockTicks = 100

func procCPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("harness: cpu time: %w", err)
	}
	return ParseProcStat(b)
}

// ErrProcStat is returned by ParseProcStat for a line that is not a /proc/<pid>/stat line.
var ErrProcStat = errors.New("harness: malformed /proc/<pid>/stat")

// ParseProcStat returns utime+stime of a /proc/<pid>/stat line (fields 14 and 15, clock ticks of 1/100 s).
// The command name (field 2) is in parentheses and may hold spaces and parentheses: the fields are counted
// after the last ')'.
func ParseProcStat(b []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, ErrProcStat
	}
	f := strings.Fields(string(b[i+1:]))
	// After ')': field 3 (state) is f[0]; utime is field 14 → f[11], stime field 15 → f[12].
	if len(f) < 13 {
		return 0, ErrProcStat
	}
	// 32 bits of ticks each (497 days of CPU) keep the sum in nanoseconds far from overflow.
	ut, err1 := strconv.ParseUint(f[11], 10, 32)
	st, err2 := strconv.ParseUint(f[12], 10, 32)
	if err1 != nil || err2 != nil {
		return 0, ErrProcStat
	}
	return time.Duration(ut+st) * (time.Second / clockTicks), nil
}

// waitLog polls the process log until match returns a non-empty result, the process exits, or ctx ends.
func waitLog(ctx context.Context, p *Proc, match func(log string) (string, bool)) (string, error) {
	t := time.NewTicker(15 * time.Millisecond)
	defer t.Stop()
	for {
		if v, ok := match(p.Log()); ok {
			return v, nil
		}
		if done, err := p.Exited(); done {
			return "", fmt.Errorf("harness: %s exited during start-up (%v):\n%s", p.Name, err, p.Tail(30))
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("harness: %s: start-up: %w:\n%s", p.Name, ctx.Err(), p.Tail(30))
		case <-t.C:
		}
	}
}
