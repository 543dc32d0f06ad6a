package vk

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/pool"
	"github.com/sandman-dev/sandman/runtime"
)

// nodeConfig describes the virtual node.
type nodeConfig struct {
	Name string
	// PoolName is the value of the sandman.io/pool label and taint.
	PoolName string
	// IP is the node's InternalIP (where the apiserver reaches its kubelet
	// port); KubeletPort the port.
	IP          string
	KubeletPort int32
	Version     string
	// QueueRoom is how many pods beyond its slots the node advertises room
	// for (0: pods = slots, the truthful capacity). kube-scheduler then
	// binds a burst that does not fit once, and the pool's fair admission
	// queue holds the pods beyond the slots (WaitingForSlot) instead of
	// kube-scheduler retrying each on back-off. CPU and memory are scaled
	// in the same proportion, so a pod mix that fits the slots fits the
	// advertised node alike. The node says so (podcontract.AnnotationSlots,
	// podcontract.AnnotationQueueRoom and the condition podcontract.ConditionQueueRoom).
	QueueRoom int
}

// nodeSpec is the virtual node as it is registered: labels for the node
// selector, a taint sandboxes tolerate, addresses, and the capacity of the
// pool's healthy node agents.
func nodeSpec(cfg nodeConfig, capa runtime.Capacity, agents int) corev1.Node {
	n := corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: cfg.Name,
			Labels: map[string]string{
				podcontract.LabelPool:    cfg.PoolName,
				"type":                   "virtual-kubelet",
				"kubernetes.io/os":       "linux",
				"kubernetes.io/arch":     "amd64",
				"kubernetes.io/role":     "agent",
				"kubernetes.io/hostname": cfg.Name,
			},
		},
		Spec: corev1.NodeSpec{
			Taints: []corev1.Taint{{Key: podcontract.LabelPool, Value: cfg.PoolName, Effect: corev1.TaintEffectNoSchedule}},
		},
		Status: corev1.NodeStatus{
			Phase: corev1.NodeRunning,
			// Only the InternalIP when there is one: an apiserver that
			// prefers Hostname (its default order) would try to resolve
			// the virtual node's name to reach the kubelet port.
			Addresses:       []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: cfg.Name}},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: cfg.KubeletPort}},
			NodeInfo: corev1.NodeSystemInfo{
				OperatingSystem: "linux", Architecture: "amd64", KubeletVersion: cfg.Version,
				ContainerRuntimeVersion: "containerd://sandman",
			},
		},
	}
	if cfg.IP != "" {
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: cfg.IP}}
	}
	setCapacity(&n, capa, agents, cfg.QueueRoom)
	return n
}

// maxAdvertised caps a scaled capacity figure (2^62: 4 EiB of memory, or
// 4.6 × 10^15 cores).
const maxAdvertised = 1 << 62

// Advertised is what a virtual node with queue room advertises for a
// pool's capacity: pods = slots + room, CPU and memory scaled alike
// (nothing beyond the slots while there are none), at most maxAdvertised.
func Advertised(capa runtime.Capacity, room int) (pods int64, milliCPU, memory int64) {
	pods, milliCPU, memory = int64(capa.Slots), capa.Resources.MilliCPU, capa.Resources.MemoryBytes
	if room <= 0 || capa.Slots == 0 {
		return pods, milliCPU, memory
	}
	scale := func(v int64) int64 {
		// v × (slots+room)/slots, saturated: a node agent without a
		// memory limit reports its host's (or a huge figure), and the
		// default room is 100,000 pods; past int64 a float conversion
		// would turn negative and the apiserver would refuse the node.
		f := float64(v) * float64(capa.Slots+room) / float64(capa.Slots)
		if f >= maxAdvertised {
			return maxAdvertised
		}
		return int64(f)
	}
	return int64(capa.Slots + room), scale(milliCPU), scale(memory)
}

func setCapacity(n *corev1.Node, capa runtime.Capacity, agents, room int) {
	pods, milliCPU, memory := Advertised(capa, room)
	rl := corev1.ResourceList{
		corev1.ResourcePods:   *resource.NewQuantity(pods, resource.DecimalSI),
		corev1.ResourceCPU:    *resource.NewMilliQuantity(milliCPU, resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(memory, resource.BinarySI),
	}
	n.Status.Capacity, n.Status.Allocatable = rl, rl.DeepCopy()
	now := metav1.Now()
	agentsReady := corev1.NodeCondition{Type: podcontract.ConditionNodeAgentsReady, Status: corev1.ConditionTrue, Reason: podcontract.ReasonNodeAgentsReachable,
		Message: strconv.Itoa(agents) + " node agents reachable", LastHeartbeatTime: now, LastTransitionTime: now}
	if agents == 0 {
		agentsReady.Status, agentsReady.Reason, agentsReady.Message = corev1.ConditionFalse, podcontract.ReasonNoNodeAgents, "no node agent is reachable: pods wait for a slot"
	}
	n.Status.Conditions = []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "sandman virtual node is ready", LastHeartbeatTime: now, LastTransitionTime: now},
		{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory", LastHeartbeatTime: now, LastTransitionTime: now},
		{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasNoDiskPressure", LastHeartbeatTime: now, LastTransitionTime: now},
		{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientPID", LastHeartbeatTime: now, LastTransitionTime: now},
		{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionFalse, Reason: "RouteCreated", LastHeartbeatTime: now, LastTransitionTime: now},
		agentsReady,
	}
	if room > 0 {
		truth := fmt.Sprintf("%d slots, %s CPU, %s memory", capa.Slots,
			resource.NewMilliQuantity(capa.Resources.MilliCPU, resource.DecimalSI), resource.NewQuantity(capa.Resources.MemoryBytes, resource.BinarySI))
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[podcontract.AnnotationSlots] = truth
		n.Annotations[podcontract.AnnotationQueueRoom] = strconv.Itoa(room)
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: podcontract.ConditionQueueRoom, Status: corev1.ConditionTrue,
			Reason: podcontract.ReasonQueueRoomAdvertised, LastHeartbeatTime: now, LastTransitionTime: now,
			Message: fmt.Sprintf("capacity includes room for %d queued pods beyond the pool's %s (pods, CPU and memory scaled alike): "+
				"pods beyond the slots wait in the pool's fair admission queue (event WaitingForSlot), not in kube-scheduler", room, truth)})
	}
}

// nodeProvider reports the pool's capacity as the virtual node's status.
// Its Ping checks only the provider itself: one unhealthy worker must not
// make the whole virtual node NotReady.
type nodeProvider struct {
	Config nodeConfig
	Pool   *pool.Pool
	// Interval between capacity checks (default 1 s).
	Interval time.Duration
	// Nodes, when set, is read every ResyncInterval (default 5 s): a node
	// whose Ready condition someone else changed (kube-controller-manager
	// marks it Unknown after an apiserver outage longer than its grace
	// period) gets its status written again at once, as a kubelet does,
	// instead of at virtual-kubelet's next periodic update a minute later.
	Nodes          corev1client.NodeInterface
	ResyncInterval time.Duration
	// Logger, when set, logs such repairs.
	Logger *slog.Logger
}

var _ node.NodeProvider = (*nodeProvider)(nil)

// Ping implements node.NodeProvider.
func (np *nodeProvider) Ping(ctx context.Context) error { return ctx.Err() }

// NotifyNodeStatus implements node.NodeProvider: a status is pushed when
// the healthy capacity changes.
func (np *nodeProvider) NotifyNodeStatus(ctx context.Context, cb func(*corev1.Node)) {
	interval := np.Interval
	if interval <= 0 {
		interval = time.Second
	}
	resync := np.ResyncInterval
	if resync <= 0 {
		resync = 5 * time.Second
	}
	go func() {
		var last string
		var checked time.Time
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			capa, agents := np.capacity()
			if np.Nodes != nil && time.Since(checked) >= resync {
				checked = time.Now()
				if why := np.notReadyInAPI(ctx); why != "" {
					if np.Logger != nil {
						np.Logger.Info("the node's status in the API is not ours; writing it again", "vnode", np.Config.Name, "status", why)
					}
					last = ""
				}
			}
			if key := fmt.Sprint(capa, agents); key != last {
				last = key
				n := nodeSpec(np.Config, capa, agents)
				cb(&n)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// notReadyInAPI is the node's Ready condition in the API when it is not
// True (an unreadable node is left to the next check).
func (np *nodeProvider) notReadyInAPI(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := np.Nodes.Get(ctx, np.Config.Name, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			if c.Status == corev1.ConditionTrue {
				return ""
			}
			return string(c.Status) + " " + c.Reason + ": " + c.Message
		}
	}
	return "no Ready condition"
}

func (np *nodeProvider) capacity() (runtime.Capacity, int) {
	agents := 0
	for _, v := range np.Pool.Nodes() {
		if v.Healthy {
			agents++
		}
	}
	return np.Pool.Capacity(), agents
}

// Capacity is the pool's healthy capacity and number of reachable agents.
func (np *nodeProvider) Capacity() (runtime.Capacity, int) { return np.capacity() }
