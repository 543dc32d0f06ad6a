package nodeimage

import (
	"encoding/base64"
	"encoding/json"
	"strings"
)

// parseDockerConfigs reads docker config JSON documents (the
// .dockerconfigjson of kubernetes.io/dockerconfigjson secrets, or the older
// .dockercfg map) into host → [user, password]. Documents that do not parse
// are skipped: a pod's unrelated secret must not fail its pull.
func parseDockerConfigs(secrets [][]byte) map[string][2]string {
	type auth struct {
		Auth     string `json:"auth"`
		Username string `json:"username"`
		Password string `json:"password"`
	}
	out := map[string][2]string{}
	for _, s := range secrets {
		var cfg struct {
			Auths map[string]auth `json:"auths"`
		}
		if json.Unmarshal(s, &cfg) != nil {
			continue
		}
		if cfg.Auths == nil {
			// .dockercfg: the map itself.
			var legacy map[string]auth
			if json.Unmarshal(s, &legacy) != nil {
				continue
			}
			cfg.Auths = legacy
		}
		for host, a := range cfg.Auths {
			user, pass := a.Username, a.Password
			if a.Auth != "" {
				if b, err := base64.StdEncoding.DecodeString(a.Auth); err == nil {
					user, pass, _ = strings.Cut(string(b), ":")
				}
			}
			out[registryHost(host)] = [2]string{user, pass}
		}
	}
	return out
}

// registryHost turns a docker config key (https://index.docker.io/v1/,
// host:port, host/path) into the host the resolver asks about.
func registryHost(key string) string {
	host := strings.TrimPrefix(strings.TrimPrefix(key, "https://"), "http://")
	host, _, _ = strings.Cut(host, "/")
	if host == "docker.io" || host == "index.docker.io" {
		host = "registry-1.docker.io"
	}
	return host
}
