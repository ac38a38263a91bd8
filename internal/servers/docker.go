package servers

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
)

// docker is a small client of the Docker Engine API, covering what this
// package does with containers, images and networks and nothing else. It
// speaks HTTP over the engine's socket: DOCKER_HOST when set (unix:// or plain
// tcp://), /var/run/docker.sock otherwise.
//
// It replaces a dependency on a Docker client library, whose module graph
// (moby, runc, the OCI specs, logrus…) every application importing dlock
// would otherwise inherit in its go.mod and go.sum, for the sake of a test
// harness they never run.
type docker struct {
	hc   *http.Client
	base string // "http://docker/v1.NN": the API version agreed with the engine
}

// maxAPIVersion is the newest Engine API version this client asks for; an
// older engine is spoken to in its own version. The calls used here have
// not changed since long before the oldest engine still supported.
const maxAPIVersion = "1.47"

// apiError is an error reply from the engine: its HTTP status and message.
type apiError struct {
	op     string // "POST /containers/create"
	status int
	msg    string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("docker %s: %d %s: %s", e.op, e.status, http.StatusText(e.status), e.msg)
}

// hasStatus reports whether err is an engine reply with that HTTP status.
func hasStatus(err error, status int) bool {
	var ae *apiError
	return errors.As(err, &ae) && ae.status == status
}

// newDocker connects to the engine named by DOCKER_HOST, or to the default
// socket, and agrees on an API version; ctx bounds the ping. Its errors do
// not wrap ErrNoDocker; the caller does.
func newDocker(ctx context.Context) (*docker, error) {
	host := os.Getenv("DOCKER_HOST")
	if host == "" {
		host = "unix:///var/run/docker.sock"
	}
	scheme, addr, ok := strings.Cut(host, "://")
	if !ok || addr == "" {
		return nil, fmt.Errorf("DOCKER_HOST=%q: want unix:///path or tcp://host:port", host)
	}
	var network string
	switch scheme {
	case "unix":
		network = "unix"
	case "tcp", "http":
		if os.Getenv("DOCKER_TLS_VERIFY") != "" {
			return nil, errors.New("DOCKER_TLS_VERIFY is set: this harness speaks plain HTTP only (use the unix socket)")
		}
		network = "tcp"
		addr, _, _ = strings.Cut(addr, "/")
	default:
		return nil, fmt.Errorf("DOCKER_HOST=%q: scheme %q is not supported (want unix or tcp)", host, scheme)
	}
	tr := &http.Transport{
		Proxy: nil, // never through an HTTP proxy, whatever the environment says
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
		MaxIdleConnsPerHost: 8,
	}
	d := &docker{hc: &http.Client{Transport: tr}, base: "http://docker"}

	// GET /_ping answers in every version and names the engine's own.
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.base+"/_ping", nil)
	if err != nil {
		return nil, err
	}
	resp, err := d.hc.Do(req)
	if err != nil {
		tr.CloseIdleConnections()
		return nil, fmt.Errorf("docker ping at %s: %w", host, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<10))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		tr.CloseIdleConnections()
		return nil, fmt.Errorf("docker ping at %s: %s", host, resp.Status)
	}
	version := maxAPIVersion
	if v := resp.Header.Get("API-Version"); v != "" && versionLess(v, maxAPIVersion) {
		version = v
	}
	d.base += "/v" + version
	return d, nil
}

// versionLess compares two "major.minor" API versions.
func versionLess(a, b string) bool {
	parse := func(v string) (int, int) {
		ma, mi, _ := strings.Cut(v, ".")
		x, _ := strconv.Atoi(ma)
		y, _ := strconv.Atoi(mi)
		return x, y
	}
	amaj, amin := parse(a)
	bmaj, bmin := parse(b)
	return amaj < bmaj || amaj == bmaj && amin < bmin
}

// closeIdle drops the kept-alive connections to the engine.
func (d *docker) closeIdle() { d.hc.CloseIdleConnections() }

// do sends one request. body, when not nil and not an io.Reader, is sent as
// JSON. A reply with a status of 300 or more, other than one in okStatus, is
// returned as an *apiError; otherwise the caller owns resp.Body.
func (d *docker) do(ctx context.Context, method, path string, query url.Values, body any, okStatus ...int) (*http.Response, error) {
	var r io.Reader
	contentType := ""
	switch b := body.(type) {
	case nil:
	case io.Reader:
		r, contentType = b, "application/x-tar"
	default:
		j, err := json.Marshal(b)
		if err != nil {
			return nil, err
		}
		r, contentType = bytes.NewReader(j), "application/json"
	}
	u := d.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, r)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	op := method + " " + path
	resp, err := d.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("docker %s: %w", op, err)
	}
	if resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	for _, s := range okStatus {
		if resp.StatusCode == s {
			return resp, nil
		}
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var m struct{ Message string }
	if json.Unmarshal(msg, &m) == nil && m.Message != "" {
		msg = []byte(m.Message)
	}
	return nil, &apiError{op: op, status: resp.StatusCode, msg: strings.TrimSpace(string(msg))}
}

// call sends a request and decodes a JSON reply into out, when not nil.
func (d *docker) call(ctx context.Context, method, path string, query url.Values, body, out any, okStatus ...int) error {
	resp, err := d.do(ctx, method, path, query, body, okStatus...)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil || resp.StatusCode >= 300 {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("docker %s %s: decoding the reply: %w", method, path, err)
	}
	return nil
}

func containerPath(id string, rest ...string) string {
	return "/containers/" + url.PathEscape(id) + strings.Join(rest, "")
}

// labelFilter is the filters parameter selecting objects that carry label.
func labelFilter(label string) url.Values {
	f, _ := json.Marshal(map[string][]string{"label": {label}})
	return url.Values{"filters": {string(f)}}
}

// imageExists reports whether the engine has the image.
func (d *docker) imageExists(ctx context.Context, name string) (bool, error) {
	err := d.call(ctx, http.MethodGet, "/images/"+url.PathEscape(name)+"/json", nil, nil, nil)
	switch {
	case err == nil:
		return true, nil
	case hasStatus(err, http.StatusNotFound):
		return false, nil
	default:
		return false, err
	}
}

// buildImage builds the image tag from a tar build context holding a
// Dockerfile, removing intermediate containers, and returns the build's
// output. A failed build step is an error, though the engine reports it in
// the body of a 200 reply.
func (d *docker) buildImage(ctx context.Context, tag string, labels map[string]string, buildCtx io.Reader) (string, error) {
	l, err := json.Marshal(labels)
	if err != nil {
		return "", err
	}
	q := url.Values{
		"t": {tag}, "dockerfile": {"Dockerfile"},
		"rm": {"1"}, "forcerm": {"1"}, "labels": {string(l)},
	}
	resp, err := d.do(ctx, http.MethodPost, "/build", q, buildCtx)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var out strings.Builder
	dec := json.NewDecoder(resp.Body)
	for {
		var m struct {
			Stream      string
			Error       string
			ErrorDetail struct{ Message string }
		}
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return out.String(), nil
		} else if err != nil {
			return out.String(), fmt.Errorf("docker POST /build: reading the output: %w", err)
		}
		out.WriteString(m.Stream)
		if m.Error != "" || m.ErrorDetail.Message != "" {
			return out.String(), fmt.Errorf("docker POST /build: %s", cmp.Or(m.ErrorDetail.Message, m.Error))
		}
	}
}

// containerSpec is the body of POST /containers/create, as much of it as this
// package sets.
type containerSpec struct {
	Image            string
	Cmd              []string            `json:",omitempty"`
	Env              []string            `json:",omitempty"`
	ExposedPorts     map[string]struct{} `json:",omitempty"`
	Labels           map[string]string   `json:",omitempty"`
	HostConfig       hostConfig
	NetworkingConfig *networkingConfig `json:",omitempty"`
}

type hostConfig struct {
	PortBindings map[string][]portBinding `json:",omitempty"`
	NetworkMode  string                   `json:",omitempty"`
}

type portBinding struct {
	HostIP   string `json:"HostIp"`
	HostPort string
}

type networkingConfig struct {
	EndpointsConfig map[string]endpointConfig
}

type endpointConfig struct {
	Aliases []string `json:",omitempty"`
}

// createContainer creates a container named name and returns its id.
func (d *docker) createContainer(ctx context.Context, name string, spec *containerSpec) (string, error) {
	var out struct {
		ID string `json:"Id"`
	}
	err := d.call(ctx, http.MethodPost, "/containers/create", url.Values{"name": {name}}, spec, &out)
	return out.ID, err
}

// startContainer starts a container; one already running is not an error.
func (d *docker) startContainer(ctx context.Context, id string) error {
	return d.call(ctx, http.MethodPost, containerPath(id, "/start"), nil, nil, nil, http.StatusNotModified)
}

// killContainer sends signal to a container's main process; one that is not
// running is an *apiError with status 409.
func (d *docker) killContainer(ctx context.Context, id, signal string) error {
	return d.call(ctx, http.MethodPost, containerPath(id, "/kill"), url.Values{"signal": {signal}}, nil, nil)
}

// pauseContainer freezes a container's processes.
func (d *docker) pauseContainer(ctx context.Context, id string) error {
	return d.call(ctx, http.MethodPost, containerPath(id, "/pause"), nil, nil, nil)
}

// unpauseContainer resumes them; a container that is not paused is an
// error saying "is not paused".
func (d *docker) unpauseContainer(ctx context.Context, id string) error {
	return d.call(ctx, http.MethodPost, containerPath(id, "/unpause"), nil, nil, nil)
}

// waitContainer returns once the container is not running.
func (d *docker) waitContainer(ctx context.Context, id string) error {
	var out struct{ Error *struct{ Message string } }
	if err := d.call(ctx, http.MethodPost, containerPath(id, "/wait"), url.Values{"condition": {"not-running"}}, nil, &out); err != nil {
		return err
	}
	if out.Error != nil && out.Error.Message != "" {
		return fmt.Errorf("docker wait %s: %s", id, out.Error.Message)
	}
	return nil
}

// removeContainer removes a container, running or not, with its anonymous
// volumes; one that does not exist is not an error.
func (d *docker) removeContainer(ctx context.Context, id string) error {
	return d.call(ctx, http.MethodDelete, containerPath(id), url.Values{"force": {"1"}, "v": {"1"}}, nil, nil, http.StatusNotFound)
}

// containerInfo is the part of GET /containers/{id}/json this package reads.
type containerInfo struct {
	ID    string `json:"Id"`
	Name  string // "/" + the name given at create
	State struct {
		Running  bool
		Paused   bool
		ExitCode int
	}
	Config struct {
		Labels map[string]string
	}
	NetworkSettings struct {
		Ports    map[string][]portBinding
		Networks map[string]endpointConfig
	}
}

// inspectContainer describes a container; one that does not exist is an
// *apiError with status 404.
func (d *docker) inspectContainer(ctx context.Context, id string) (*containerInfo, error) {
	var c containerInfo
	if err := d.call(ctx, http.MethodGet, containerPath(id, "/json"), nil, nil, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// containerLogs returns the last tail lines a container wrote to stdout and
// stderr, interleaved.
func (d *docker) containerLogs(ctx context.Context, id string, tail int) (string, error) {
	q := url.Values{"stdout": {"1"}, "stderr": {"1"}, "tail": {strconv.Itoa(tail)}}
	resp, err := d.do(ctx, http.MethodGet, containerPath(id, "/logs"), q, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	return demux(io.LimitReader(resp.Body, 1<<20))
}

// demux undoes the framing of the log stream of a container without a TTY:
// each chunk is preceded by 8 bytes, the stream (1 stdout, 2 stderr) then
// three zero bytes then the chunk's length, big-endian. A stream that does
// not start like that is returned as it is.
func demux(r io.Reader) (string, error) {
	br := bufio.NewReader(r)
	var out bytes.Buffer
	for {
		hdr, err := br.Peek(8)
		if len(hdr) == 0 && errors.Is(err, io.EOF) {
			return out.String(), nil
		}
		if len(hdr) < 8 || hdr[0] > 2 || hdr[1] != 0 || hdr[2] != 0 || hdr[3] != 0 {
			_, err := io.Copy(&out, br)
			return out.String(), err
		}
		n := binary.BigEndian.Uint32(hdr[4:])
		_, _ = br.Discard(8)
		if _, err := io.CopyN(&out, br, int64(n)); err != nil {
			return out.String(), err
		}
	}
}

// labelled is an entry of a container or network list.
type labelled struct {
	ID     string `json:"Id"`
	Labels map[string]string
}

// listContainers lists every container, running or not, that carries label.
func (d *docker) listContainers(ctx context.Context, label string) ([]labelled, error) {
	q := labelFilter(label)
	q.Set("all", "1")
	var out []labelled
	err := d.call(ctx, http.MethodGet, "/containers/json", q, nil, &out)
	return out, err
}

// createNetwork makes a bridge network and returns its id.
func (d *docker) createNetwork(ctx context.Context, name string, labels map[string]string) (string, error) {
	body := struct {
		Name           string
		Driver         string
		CheckDuplicate bool
		Labels         map[string]string
	}{name, "bridge", true, labels}
	var out struct {
		ID string `json:"Id"`
	}
	err := d.call(ctx, http.MethodPost, "/networks/create", nil, body, &out)
	return out.ID, err
}

// removeNetwork removes a network; one that does not exist is not an error.
func (d *docker) removeNetwork(ctx context.Context, id string) error {
	return d.call(ctx, http.MethodDelete, "/networks/"+url.PathEscape(id), nil, nil, nil, http.StatusNotFound)
}

// listNetworks lists the networks that carry label.
func (d *docker) listNetworks(ctx context.Context, label string) ([]labelled, error) {
	var out []labelled
	err := d.call(ctx, http.MethodGet, "/networks", labelFilter(label), nil, &out)
	return out, err
}
