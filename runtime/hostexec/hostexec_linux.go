package hostexec

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Environment variables that carry the shims' settings from the agent to
// the processes it execs through them.
const (
	envRoot   = "SANDMAN_HOSTEXEC_ROOT"
	envCNIBin = "SANDMAN_HOSTEXEC_CNI_BIN"
	envShims  = "SANDMAN_HOSTEXEC_SHIMS"
)

// hostPath is the search path for tools inside the host root.
const hostPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Setup writes the shims and points this process's PATH at the tool shims.
// It returns the directory to hand go-cni as its plugin directory.
func Setup(cfg Config) (cniDir string, err error) {
	if cfg.HostRoot == "" || cfg.CNIBinDir == "" || cfg.ShimDir == "" {
		return "", errors.New("hostexec: HostRoot, CNIBinDir and ShimDir are required")
	}
	if cfg.Executable == "" {
		if cfg.Executable, err = os.Executable(); err != nil {
			return "", fmt.Errorf("hostexec: %w", err)
		}
	}
	plugins, err := os.ReadDir(filepath.Join(cfg.HostRoot, cfg.CNIBinDir))
	if err != nil {
		return "", fmt.Errorf("hostexec: the host's CNI plugins (%s under %s): %w", cfg.CNIBinDir, cfg.HostRoot, err)
	}
	cniDir = filepath.Join(cfg.ShimDir, "cni")
	binDir := filepath.Join(cfg.ShimDir, "bin")
	for _, d := range []string{cniDir, binDir} {
		if err := os.RemoveAll(d); err != nil {
			return "", fmt.Errorf("hostexec: %w", err)
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", fmt.Errorf("hostexec: %w", err)
		}
	}
	link := func(dir, name string) error {
		if err := os.Symlink(cfg.Executable, filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("hostexec: shim %s: %w", name, err)
		}
		return nil
	}
	for _, p := range plugins {
		if p.IsDir() {
			continue
		}
		if err := link(cniDir, p.Name()); err != nil {
			return "", err
		}
	}
	for _, t := range Tools {
		if err := link(binDir, t); err != nil {
			return "", err
		}
	}
	for k, v := range map[string]string{envRoot: cfg.HostRoot, envCNIBin: cfg.CNIBinDir, envShims: cfg.ShimDir,
		"PATH": binDir + ":" + os.Getenv("PATH")} {
		if err := os.Setenv(k, v); err != nil {
			return "", err
		}
	}
	return cniDir, nil
}

// Main runs the host program a shim stands for and does not return, when
// this process was started through a shim; otherwise it returns at once.
// Call it first in main.
func Main() {
	root := os.Getenv(envRoot)
	if root == "" {
		return
	}
	argv0 := os.Args[0]
	if !strings.Contains(argv0, "/") {
		// Started by name through PATH (exec.Command("iptables")).
		if p, err := exec.LookPath(argv0); err == nil {
			argv0 = p
		}
	}
	dir, name := filepath.Dir(argv0), filepath.Base(argv0)
	shims := os.Getenv(envShims)
	var target string
	switch dir {
	case filepath.Join(shims, "cni"):
		target = filepath.Join(os.Getenv(envCNIBin), name)
	case filepath.Join(shims, "bin"):
		target = name
	default:
		return // the agent itself
	}
	if err := execOnHost(root, target); err != nil {
		fmt.Fprintf(os.Stderr, "sandman-node: run the host's %s: %v\n", name, err)
		os.Exit(127)
	}
}

func execOnHost(root, target string) error {
	env := os.Environ()
	set := func(k, v string) {
		for i, kv := range env {
			if strings.HasPrefix(kv, k+"=") {
				env[i] = k + "=" + v
				return
			}
		}
		env = append(env, k+"="+v)
	}
	// The namespace file lives in the agent's mounts; an open descriptor
	// survives the chroot and the exec.
	if p := os.Getenv("CNI_NETNS"); p != "" {
		fd, err := syscall.Open(p, syscall.O_RDONLY, 0)
		if err != nil {
			return fmt.Errorf("open network namespace %s: %w", p, err)
		}
		set("CNI_NETNS", "/proc/self/fd/"+strconv.Itoa(fd))
	}
	if os.Getenv("CNI_COMMAND") != "" {
		set("CNI_PATH", os.Getenv(envCNIBin))
	}
	set("PATH", hostPath)
	for _, k := range []string{envRoot, envCNIBin, envShims} {
		for i := len(env) - 1; i >= 0; i-- {
			if strings.HasPrefix(env[i], k+"=") {
				env = append(env[:i], env[i+1:]...)
			}
		}
	}
	if err := syscall.Chroot(root); err != nil {
		return fmt.Errorf("chroot %s: %w", root, err)
	}
	if err := syscall.Chdir("/"); err != nil {
		return err
	}
	if !strings.Contains(target, "/") {
		found := ""
		for d := range strings.SplitSeq(hostPath, ":") {
			if st, err := os.Stat(filepath.Join(d, target)); err == nil && !st.IsDir() {
				found = filepath.Join(d, target)
				break
			}
		}
		if found == "" {
			return fmt.Errorf("%s not found on the host (%s)", target, hostPath)
		}
		target = found
	}
	args := append([]string{target}, os.Args[1:]...)
	return syscall.Exec(target, args, env)
}
