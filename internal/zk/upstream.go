package zk

// Not part of go-zookeeper: what this copy takes from the upstream package
// instead of defining it again, so that its *Conn's methods have the same
// signatures as upstream's *zk.Conn (one interface serves both), and that
// errors.Is(err, zk.ErrNoNode) matches the errors of either client. The
// constants stay in constants.go, with the same values and (aliased) types.

import upstream "github.com/go-zookeeper/zk"

type (
	ACL                 = upstream.ACL
	Stat                = upstream.Stat
	Event               = upstream.Event
	EventType           = upstream.EventType
	EventCallback       = upstream.EventCallback
	State               = upstream.State
	Dialer              = upstream.Dialer
	Logger              = upstream.Logger
	HostProvider        = upstream.HostProvider
	MultiResponse       = upstream.MultiResponse
	PathVersionRequest  = upstream.PathVersionRequest
	CheckVersionRequest = upstream.CheckVersionRequest
	CreateRequest       = upstream.CreateRequest
	CreateTTLRequest    = upstream.CreateTTLRequest
	DeleteRequest       = upstream.DeleteRequest
	SetDataRequest      = upstream.SetDataRequest
	Mode                = upstream.Mode
	ServerClient        = upstream.ServerClient
	ServerClients       = upstream.ServerClients
	ServerStats         = upstream.ServerStats
)

var (
	ErrNoServer                = upstream.ErrNoServer
	ErrInvalidPath             = upstream.ErrInvalidPath
	ErrConnectionClosed        = upstream.ErrConnectionClosed
	ErrUnknown                 = upstream.ErrUnknown
	ErrAPIError                = upstream.ErrAPIError
	ErrNoNode                  = upstream.ErrNoNode
	ErrNoAuth                  = upstream.ErrNoAuth
	ErrBadVersion              = upstream.ErrBadVersion
	ErrNoChildrenForEphemerals = upstream.ErrNoChildrenForEphemerals
	ErrNodeExists              = upstream.ErrNodeExists
	ErrNotEmpty                = upstream.ErrNotEmpty
	ErrSessionExpired          = upstream.ErrSessionExpired
	ErrInvalidACL              = upstream.ErrInvalidACL
	ErrInvalidFlags            = upstream.ErrInvalidFlags
	ErrAuthFailed              = upstream.ErrAuthFailed
	ErrClosing                 = upstream.ErrClosing
	ErrNothing                 = upstream.ErrNothing
	ErrSessionMoved            = upstream.ErrSessionMoved
	ErrReconfigDisabled        = upstream.ErrReconfigDisabled
	ErrBadArguments            = upstream.ErrBadArguments
	ErrUnhandledFieldType      = upstream.ErrUnhandledFieldType
	ErrPtrExpected             = upstream.ErrPtrExpected
	ErrShortBuffer             = upstream.ErrShortBuffer
)
