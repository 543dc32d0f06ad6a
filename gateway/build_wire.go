package gateway

import "time"

// Wire types of E2B's template build API as SDK v2.51 sends and reads
// them (src/template/buildApi.ts; e2b-dev/infra spec/openapi.yml).

// templateBuildRequest is TemplateBuildRequestV3, the body of POST
// /v3/templates: a name (optionally name:tag), more tags, and the
// sandboxes' resources.
type templateBuildRequest struct {
	Name     string   `json:"name"`
	Alias    string   `json:"alias"` // deprecated spelling of name
	Tags     []string `json:"tags"`
	CPUCount *int64   `json:"cpuCount"`
	MemoryMB *int64   `json:"memoryMB"`
}

// templateRequestResponse is TemplateRequestResponseV3.
type templateRequestResponse struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Public     bool     `json:"public"`
	Names      []string `json:"names"`
	Tags       []string `json:"tags"`
	Aliases    []string `json:"aliases"`
}

// templateStep is TemplateStep: one instruction of a template (RUN, COPY,
// ENV, WORKDIR, USER) with its arguments; FilesHash is a COPY's content
// hash (the SDK's, over the files and their paths).
type templateStep struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash,omitempty"`
	Force     bool     `json:"force,omitempty"`
}

// templateBuildStart is TemplateBuildStartV2, the body of POST
// /v2/templates/{templateID}/builds/{buildID}.
type templateBuildStart struct {
	FromImage         string         `json:"fromImage"`
	FromTemplate      string         `json:"fromTemplate"`
	FromImageRegistry map[string]any `json:"fromImageRegistry"`
	Force             bool           `json:"force"`
	Steps             []templateStep `json:"steps"`
	StartCmd          string         `json:"startCmd"`
	ReadyCmd          string         `json:"readyCmd"`
}

// fileUpload is TemplateBuildFileUpload: whether the gateway holds a
// COPY's files already, and where to PUT them if not.
type fileUpload struct {
	Present bool    `json:"present"`
	URL     *string `json:"url,omitempty"`
}

// Build states (TemplateBuildStatus).
const (
	buildWaiting  = "waiting"
	buildBuilding = "building"
	buildReady    = "ready"
	buildError    = "error"
)

// buildLogEntry is BuildLogEntry.
type buildLogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Message   string    `json:"message"`
	Level     string    `json:"level"`
	Step      string    `json:"step,omitempty"`
}

// buildStatusReason is BuildStatusReason: why a build failed, and at which
// step (the SDK points at that step's line of the caller's code: "1" is
// the first instruction, "base" the base image).
type buildStatusReason struct {
	Message    string          `json:"message"`
	Step       string          `json:"step,omitempty"`
	LogEntries []buildLogEntry `json:"logEntries"`
}

// templateBuildInfo is TemplateBuildInfo, the answer of GET
// /templates/{templateID}/builds/{buildID}/status.
type templateBuildInfo struct {
	TemplateID string             `json:"templateID"`
	BuildID    string             `json:"buildID"`
	Status     string             `json:"status"`
	Logs       []string           `json:"logs"`
	LogEntries []buildLogEntry    `json:"logEntries"`
	Reason     *buildStatusReason `json:"reason,omitempty"`
}

// templateAlias is TemplateAliasResponse (GET /templates/aliases/{alias}).
type templateAlias struct {
	TemplateID string `json:"templateID"`
	Public     bool   `json:"public"`
}

// assignTagsRequest is AssignTemplateTagsRequest (POST /templates/tags).
type assignTagsRequest struct {
	Target string   `json:"target"`
	Tags   []string `json:"tags"`
}

// assignedTags is AssignedTemplateTags.
type assignedTags struct {
	Tags    []string `json:"tags"`
	BuildID string   `json:"buildID"`
}

// deleteTagsRequest is DeleteTemplateTagsRequest (DELETE /templates/tags).
type deleteTagsRequest struct {
	Name string   `json:"name"`
	Tags []string `json:"tags"`
}

// templateTag is TemplateTag (GET /templates/{templateID}/tags).
type templateTag struct {
	Tag       string    `json:"tag"`
	BuildID   string    `json:"buildID"`
	CreatedAt time.Time `json:"createdAt"`
}
