package harness

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && !strings.HasPrefix(strings.TrimSpace(string(b[i+1:])), "Z")
}

// Stop ends a process and the children it started (one process group): nothing is left behind.
func TestStopKillsTheProcessGroup(t *testing.T) {
	dir := t.TempDir()
	// The shell starts a child that ignores SIGTERM, prints its PID and waits.
	p, err := StartProc("sh", filepath.Join(dir, "sh.log"), "/bin/sh",
		[]string{"-c", `(trap "" TERM; sleep 60) & echo child=$!; wait`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var child int
	deadline := time.Now().Add(5 * time.Second)
	for child == 0 && time.Now().Before(deadline) {
		if _, v, ok := strings.Cut(p.Log(), "child="); ok {
			child, _ = strconv.Atoi(strings.TrimSpace(v))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if child == 0 || !alive(child) {
		t.Fatalf("no child started: %q", p.Log())
	}
	if pgid, err := syscall.Getpgid(child); err != nil || pgid != p.PID() {
		t.Fatalf("child's process group %d (%v), want %d", pgid, err, p.PID())
	}
	p.Stop(300 * time.Millisecond)
	if done, _ := p.Exited(); !done {
		t.Fatal("process still running after Stop")
	}
	if !waitGone(child, 3*time.Second) {
		t.Fatalf("child %d survived Stop", child)
	}
	if cpu, err := p.CPUTime(); err == nil {
		t.Fatalf("CPU time of an ended process: %v", cpu)
	}
}

func waitGone(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if !alive(pid) {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return !alive(pid)
}
