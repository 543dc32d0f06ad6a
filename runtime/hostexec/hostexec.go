package hostexec

// Tools are the host programs the agent runs by name (go-iptables).
var Tools = []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"}

// Config says where the host is and where the shims go.
type Config struct {
	// HostRoot is where the host's root file system is mounted (required).
	HostRoot string
	// CNIBinDir is the host's CNI plugin directory, as a host path.
	CNIBinDir string
	// ShimDir is an empty directory of the agent's own (not on the host).
	ShimDir string
	// Executable is the agent's binary (default: os.Executable).
	Executable string
}
