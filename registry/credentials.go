package registry

import (
	"fmt"
	"os"
	"path/filepath"

	dockerconfig "github.com/docker/cli/cli/config"
	"github.com/docker/cli/cli/config/configfile"
	"github.com/docker/cli/cli/config/types"
)

// Credential is what a registry host is logged in with, and where that
// was found, so a refusal can say which file or helper to fix.
type Credential struct {
	User   string
	Secret string // a password, or an identity token when User is ""
	// Source is where it came from: a config file's path, or a credential
	// helper's name; for no credential, where was looked.
	Source string
}

// DockerCredentials finds credentials as docker and go-containerregistry
// do: $DOCKER_CONFIG or ~/.docker/config.json (its auths, credsStore and
// credHelpers), else $REGISTRY_AUTH_FILE or Podman's containers/auth.json.
func DockerCredentials(host string) (Credential, error) {
	cf, path, err := loadDockerConfig()
	if err != nil {
		return Credential{}, err
	}
	if cf == nil {
		return Credential{Source: path}, nil
	}
	key := host
	if host == "docker.io" || host == "registry-1.docker.io" || host == "index.docker.io" {
		key = "https://index.docker.io/v1/"
	}
	source := cf.Filename
	if h, ok := cf.CredentialHelpers[key]; ok {
		source = "credential helper docker-credential-" + h + " (named in " + cf.Filename + ")"
	} else if cf.CredentialsStore != "" {
		source = "credential store docker-credential-" + cf.CredentialsStore + " (named in " + cf.Filename + ")"
	}
	ac, err := cf.GetAuthConfig(key)
	if err != nil {
		return Credential{Source: source}, fmt.Errorf("%s: %w", source, err)
	}
	return fromAuthConfig(ac, source), nil
}

func fromAuthConfig(ac types.AuthConfig, source string) Credential {
	if ac.IdentityToken != "" {
		return Credential{Secret: ac.IdentityToken, Source: source}
	}
	return Credential{User: ac.Username, Secret: ac.Password, Source: source}
}

// loadDockerConfig reads the first config that exists, in the keychain's
// order; with none, it returns nil and the places it looked.
func loadDockerConfig() (*configfile.ConfigFile, string, error) {
	// Read $DOCKER_CONFIG each time (docker's own Dir caches it once).
	dir := os.Getenv("DOCKER_CONFIG")
	if dir == "" {
		if home, err := os.UserHomeDir(); err == nil {
			dir = filepath.Join(home, ".docker")
		}
	}
	docker := filepath.Join(dir, dockerconfig.ConfigFileName)
	if fileExists(docker) {
		cf, err := dockerconfig.Load(dir)
		if err != nil {
			return nil, docker, fmt.Errorf("docker config: %w", err)
		}
		return cf, docker, nil
	}
	candidates := []string{os.Getenv("REGISTRY_AUTH_FILE")}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		candidates = append(candidates, filepath.Join(d, "containers/auth.json"))
	}
	if home, err := os.UserHomeDir(); err == nil {
		candidates = append(candidates, filepath.Join(home, ".config/containers/auth.json"))
	}
	for _, p := range candidates {
		if p == "" || !fileExists(p) {
			continue
		}
		f, err := os.Open(p)
		if err != nil {
			return nil, p, err
		}
		defer f.Close()
		cf := configfile.New(p)
		if err := cf.LoadFromReader(f); err != nil {
			return nil, p, fmt.Errorf("auth file %s: %w", p, err)
		}
		return cf, p, nil
	}
	return nil, docker + " (missing)", nil
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir()
}
