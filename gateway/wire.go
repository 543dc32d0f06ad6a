package gateway

import (
	"encoding/json"
	"time"
)

// Wire types of E2B's control API as SDK v2.51 sends and reads them
// (index.d.ts, components.schemas). Field names are E2B's, including its
// mixed conventions (templateID, allow_internet_access).

// newSandbox is the body of POST /v2/sandboxes (NewSandboxV2) and of the
// older POST /sandboxes (NewSandbox, which adds secure).
type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	AutoPause           *bool             `json:"autoPause"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"`
	AutoResume          *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
	Network      *networkConfig  `json:"network"`
	Mcp          json.RawMessage `json:"mcp"`
	Iam          json.RawMessage `json:"iam"`
	VolumeMounts []volumeMount   `json:"volumeMounts"`
}

// networkConfig is SandboxNetworkConfig: allowOut and denyOut (IP
// addresses, CIDRs or domain names) become the pod's egress annotations;
// rules and egressProxy are refused.
type networkConfig struct {
	AllowOut    []string        `json:"allowOut"`
	DenyOut     []string        `json:"denyOut"`
	Rules       json.RawMessage `json:"rules"`
	EgressProxy json.RawMessage `json:"egressProxy"`
	// Ingress: who may reach the sandbox's ports through the gateway,
	// and the Host header its servers see (ingress.go).
	AllowPublicTraffic *bool   `json:"allowPublicTraffic"`
	MaskRequestHost    *string `json:"maskRequestHost"`
	HTTPSPorts         []int   `json:"httpsPorts"`
}

type volumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// timeoutRequest is SandboxTimeoutRequest and ConnectSandbox(V2).
type timeoutRequest struct {
	Timeout *int64 `json:"timeout"`
	Memory  *bool  `json:"memory"`
}

// refreshRequest is SandboxRefreshRequest.
type refreshRequest struct {
	Duration *int64 `json:"duration"`
}

// sandboxJSON is Sandbox: the answer of create and connect.
type sandboxJSON struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken,omitempty"`
	Domain             *string `json:"domain"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
}

// listedSandbox is ListedSandbox: an entry of GET /v2/sandboxes.
type listedSandbox struct {
	SandboxID   string            `json:"sandboxID"`
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	ClientID    string            `json:"clientID"`
	CPUCount    int64             `json:"cpuCount"`
	MemoryMB    int64             `json:"memoryMB"`
	DiskSizeMB  int64             `json:"diskSizeMB"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	EnvdVersion string            `json:"envdVersion"`
	Metadata    map[string]string `json:"metadata"`
	State       string            `json:"state"`
}

// sandboxDetail is SandboxDetail: the answer of GET /sandboxes/{id}.
type sandboxDetail struct {
	listedSandbox
	Domain              *string      `json:"domain"`
	AllowInternetAccess *bool        `json:"allowInternetAccess"`
	Lifecycle           lifecycle    `json:"lifecycle"`
	Network             *networkInfo `json:"network,omitempty"`
}

// networkInfo is SandboxNetworkConfig as GET /sandboxes/{id} answers it:
// what the pod's annotations hold.
type networkInfo struct {
	AllowOut           []string `json:"allowOut,omitempty"`
	DenyOut            []string `json:"denyOut,omitempty"`
	AllowPublicTraffic bool     `json:"allowPublicTraffic"`
	MaskRequestHost    string   `json:"maskRequestHost,omitempty"`
	HTTPSPorts         []int    `json:"httpsPorts,omitempty"`
}

// lifecycle is SandboxLifecycle: what happens at the sandbox's timeout
// ("kill" or "pause") and whether a paused one resumes on activity.
type lifecycle struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"`
}

// Sandbox states (SandboxState).
const (
	stateRunning = "running"
	statePaused  = "paused"
)
